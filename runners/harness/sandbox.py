"""Runs untrusted code in a separate, limited process tree.

API (stable; other modules depend on it):

    limits = Limits(wall_seconds=60, memory_bytes=4 << 30, tree_memory_bytes=8 << 30)
    proc = Sandbox(workdir, limits).start(argv, env={...}, pass_fds=(fd,))
    outcome = proc.wait()          # kills the whole tree on wall-time expiry or when it hits its memory limit
    outcome.returncode, outcome.stdout, outcome.stderr, outcome.timed_out, outcome.memory_exceeded, outcome.reason

    describe() -> dict             # which protections are active on this machine

Backends, chosen per process by `KERNELBOT_SANDBOX` (read when a Sandbox is built):
  "auto" (default)  bubblewrap if it works here, else rlimits-only; a memory cgroup if one is usable;
  "require"         bubblewrap and a memory cgroup, or `SandboxUnavailable` (no submission runs without both);
  "none"            rlimits-only, no cgroup (development only).

Memory of the whole tree (`cgroups.py`): every run gets its own memory cgroup, joined by the forked child
before it execs anything, with `tree_memory_bytes` as its limit: by default min(8 GiB, 40 % of physical memory,
its share of what this node can spare: physical memory minus a margin of max(2 GiB, 20 %), divided by
`runs_per_node`), a pool's own setting up to that total, and never more, so no run can take the host below the
margin. When the kernel's OOM killer acts in the group, the
whole tree is killed and the outcome says "memory limit exceeded" (`memory_exceeded`).

Processes: the whole tree may hold `processes` tasks (threads count) through the run's pids cgroup (cgroups.py);
the first fork it refuses kills the tree at once ("process limit exceeded", `processes_exceeded`), so a fork bomb
ends in well under a second and its processes never count against another run: RLIMIT_NPROC, which counts all the
processes of a uid on the host (shared by every run of that uid), is then left at this process's own, where the tree
cannot leave its group (bubblewrap, or a dropped uid: a tree that kept this process's uid could write itself into
another group's cgroup.procs). Otherwise, and without a pids controller, RLIMIT_NPROC is the bound too.

Processes, not threads: besides `processes` tasks the tree may hold `process_count` processes at once (its group's
cgroup.procs, watched every MEMORY_POLL_S; default max(64, 32 per core of its CPU limit)). A bomb of expensive forks
(a torch-loaded process: milliseconds of page tables per fork) meets it within seconds, where it would take minutes
to reach the task limit; honest thread pools (torch, OpenMP) count as one process each.

CPU: the whole tree may use `cpu_limit` cores (cgroups.py: the cpu controller's quota, v1 or v2), by default its
devices' share of the node's cores less a reserve for the host (the agent, the supervising parent, the web tier), at
least one core; `cpus_per_device` (a pool's setting) per device instead. In its own cpu group the tree also weighs as
one task against the host's processes however many it forks, so the parent that watches it keeps its CPU and ends a
bomb at once. Where no cpu controller is usable the tree runs at nice NICE (it then only yields to the host) and
RLIMIT_CPU bounds each process's CPU time; `describe()["cpu"]` says which.

Disk: the files in the workdir together may take `disk_bytes` (FSIZE bounds each file): their size is measured every
DISK_POLL_S and the tree killed past it ("disk limit exceeded", `disk_exceeded`); a run can overshoot by what it
writes in that time.

bubblewrap as root: bwrap keeps root to build the mounts, then `setpriv` drops the child to a plain
host uid (65534 by default) with no capabilities and no_new_privs, so RLIMIT_NPROC applies and host
files are protected by their modes too. As non-root: an unprivileged user namespace
(`--unshare-user --disable-userns`), uid unchanged. Namespaces: net (only a private loopback), pid,
ipc, uts, cgroup; the loopback is up and named (a synthetic /etc/hosts: localhost and the hostname), so the
processes of one run can rendezvous there (torch.distributed), and nothing routes out. Filesystem: /usr (+ /bin,
/lib* links), a few /etc files, a synthetic /etc/passwd, the Python installation read-only, minimal /dev, own
/proc, and the workdir read-write at the same path; HOME and TMPDIR point at the workdir, the rest of the tree
(/, /tmp, /dev) is read-only.
The one other writable place is a private, size-capped /dev/shm (POSIX semaphores: `multiprocessing`
needs it, and reference-kernels' eval.py uses a process pool); its pages count against the memory cgroup.
Nothing else of the host exists inside.

rlimits are set by `prlimit` (util-linux) in front of everything, so they are inherited by the
child and cannot be raised by it: CPU (soft -> SIGXCPU, +1 s -> SIGKILL), AS (or DATA when GPU
devices are bound: the CUDA driver reserves huge virtual ranges), NPROC (counts threads too, and
all processes of that uid on the host), FSIZE, NOFILE, CORE=0.
Memory: `import torch` (CPU) peaks at ~0.7 GiB of address space on 2 cores; every extra thread
costs up to a 64 MiB malloc arena + 8 MiB stack of *virtual* space, so budget
~1 GiB + 72 MiB x threads. The 16 GiB default (contract.DEFAULT_LIMITS) covers ~200 threads.

Killing: the bwrap process is the one we started; with --die-with-parent its pid-namespace init
gets SIGKILL when it dies, and the kernel then kills every process in the namespace, including
double-forked, setsid'd descendants. The rlimits-only fallback can only kill the process group.

Known gaps: no seccomp filter (the full syscall surface, incl. unprivileged user namespaces when
bwrap ran as root, is reachable); RLIMIT_NPROC is per host uid, so concurrent sandboxes sharing a
uid share it (pass `uid=` per worker slot); total disk use in the workdir is no kernel quota (FSIZE is per
file) but measured, with some overshoot; without a usable memory cgroup (not root, no delegation) memory is limited
per process only; the fallback hides nothing of the filesystem beyond file modes and leaves the network open.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import resource
import shutil
import signal
import site
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from .cgroups import CgroupUnavailable, MemoryGroup, MemoryParent, memory_parent
from .contract import DEFAULT_LIMITS

NOBODY = 65534
_CHUNK = 1 << 16
MEMORY_POLL_S = 0.1
DISK_POLL_S = 0.25
MIN_MARGIN_BYTES = 2 << 30
MIN_TREE_BYTES = 512 << 20
DEFAULT_TREE_BYTES = 8 << 30  # a run's default memory: min(this, DEFAULT_TREE_SHARE of the host, its node's share)
DEFAULT_TREE_SHARE = 0.4
MIN_PROCESS_COUNT = 64
PROCESSES_PER_CORE = 32
NICE = 10  # the tree's priority where no cpu cgroup limits it


class SandboxUnavailable(RuntimeError):
    """KERNELBOT_SANDBOX=require but bubblewrap cannot run here."""


@dataclasses.dataclass(frozen=True)
class Limits:
    wall_seconds: float = 180.0
    cpu_seconds: int = DEFAULT_LIMITS["cpu_seconds"]
    memory_bytes: int = DEFAULT_LIMITS["memory_bytes"]  # per process; see contract.DEFAULT_LIMITS
    processes: int = DEFAULT_LIMITS["processes"]
    file_size_bytes: int = DEFAULT_LIMITS["file_size_bytes"]
    open_files: int = DEFAULT_LIMITS["open_files"]
    output_bytes: int = DEFAULT_LIMITS["output_bytes"]
    shm_bytes: int = DEFAULT_LIMITS["shm_bytes"]  # size of the private /dev/shm tmpfs; bubblewrap only
    # memory cgroup limit of the whole tree; 0: this node's share (tree_memory_limit)
    tree_memory_bytes: int = DEFAULT_LIMITS["tree_memory_bytes"]
    runs_per_node: int = DEFAULT_LIMITS["runs_per_node"]  # runs this node may hold at once: its spare memory is split
    disk_bytes: int = DEFAULT_LIMITS["disk_bytes"]  # the workdir's files together (measured); 0: unbounded
    process_count: int = DEFAULT_LIMITS["process_count"]  # processes (not threads) at once; 0: process_count_limit
    cpus_per_device: int = DEFAULT_LIMITS["cpus_per_device"]  # cores per device the run holds; 0: cpu_limit's share


@dataclasses.dataclass
class Outcome:
    returncode: int | None  # negative signal number if killed (also under bubblewrap)
    stdout: str
    stderr: str
    timed_out: bool
    reason: str  # "" on a normal exit, else why the tree was killed or how it died
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    elapsed: float = 0.0  # wall seconds from start to exit, as seen by the parent
    memory_exceeded: bool = False  # the tree hit its memory cgroup limit and was killed
    disk_exceeded: bool = False  # its workdir's files passed disk_bytes and the tree was killed
    processes_exceeded: bool = False  # a fork past its process limit (pids cgroup) was refused and the tree killed
    cpu_throttled_s: float = 0.0  # how long the tree waited for CPU past its cpu cgroup's quota (all CPUs together)


def node_memory() -> tuple[int, int]:
    """(physical memory, what runs may use together: physical minus a safety margin) in bytes."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total, total - max(MIN_MARGIN_BYTES, total // 5)


def tree_memory_limit(limits: Limits, memory: tuple[int, int] | None = None) -> int:
    """The tree's limit: the configured one, else min(DEFAULT_TREE_BYTES, DEFAULT_TREE_SHARE of the host, this
    node's share), never above what the node can spare. `memory`: `node_memory()`'s answer."""
    total, usable = memory or node_memory()
    default = min(DEFAULT_TREE_BYTES, int(total * DEFAULT_TREE_SHARE), usable // max(1, limits.runs_per_node))
    return max(MIN_TREE_BYTES, min(limits.tree_memory_bytes or default, usable))


def node_cores() -> int:
    """The cores this process may run on (its affinity: a container's or a Slurm job's cpuset, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_limit(limits: Limits, devices: int, cores: int | None = None) -> float:
    """Cores a run holding `devices` devices (0: a CPU run, one slot) may use: `cpus_per_device` each when set, else
    their share of the node's cores less a reserve of max(1, 1/8) for the host, split between `runs_per_node`
    slots; at least one core, never more than the node has."""
    cores = cores or node_cores()
    slots = max(1, devices)
    if limits.cpus_per_device:
        wanted = float(limits.cpus_per_device * slots)
    else:
        spare = cores - (max(1, cores // 8) if cores > 1 else 0)
        wanted = spare * min(slots, max(1, limits.runs_per_node)) / max(1, limits.runs_per_node)
    return round(min(float(cores), max(1.0, wanted)), 2)


def process_count_limit(limits: Limits, cpus: float) -> int:
    """Processes (not threads) the tree may hold at once: the configured number, else max(MIN_PROCESS_COUNT,
    PROCESSES_PER_CORE per core of its CPU limit), never more than its task limit."""
    return min(limits.processes, limits.process_count or max(MIN_PROCESS_COUNT, int(PROCESSES_PER_CORE * cpus)))


def disk_usage(path: str) -> int:
    """Bytes the files under `path` take on disk (not following links); what vanishes meanwhile is skipped."""
    used, stack = 0, [path]
    while stack:
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    else:
                        used += entry.stat(follow_symlinks=False).st_blocks * 512
    return used


def _mode() -> str:
    mode = os.environ.get("KERNELBOT_SANDBOX", "auto").strip().lower() or "auto"
    if mode not in ("auto", "require", "none"):
        raise ValueError(f"KERNELBOT_SANDBOX must be auto, require or none, not {mode!r}")
    return mode


def _bwrap_path() -> str | None:
    return shutil.which("bwrap")


def _privileged() -> bool:
    return os.geteuid() == 0


@functools.cache
def _bwrap_error(bwrap: str, privileged: bool) -> str:
    """ "" if bubblewrap can build our namespaces here, else why not (probed once per process)."""
    argv = [bwrap, *_namespace_args(privileged), "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
    argv += [
        "--",
        *(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] if privileged else []),
        "true",
    ]
    try:
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=30, env={"PATH": os.defpath})
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return "" if r.returncode == 0 else (r.stderr.decode(errors="replace").strip() or f"exit {r.returncode}")


def _namespace_args(privileged: bool) -> list[str]:
    args = [
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
    ]
    return args if privileged else ["--unshare-user", "--disable-userns", *args]


def _closed_to_others(path: str) -> str:
    """The first directory on the way to `path` (itself included) that other users cannot enter, else ""."""
    parts = os.path.realpath(path).split(os.sep)
    for i in range(2, len(parts) + 1):
        walked = os.sep.join(parts[:i])
        with contextlib.suppress(OSError):
            if os.path.isdir(walked) and not os.stat(walked).st_mode & 0o001:
                return walked
    return ""


def _python_paths() -> list[str]:
    """Read-only paths the interpreter and its site-packages (torch included) need."""
    cands = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
        *site.getsitepackages(),
    }
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        cands.add(site.getusersitepackages())
    cands = {p for p in cands if p and os.path.isdir(p)}
    paths = cands | {os.path.realpath(p) for p in cands}
    return _outermost(p for p in paths if p != "/" and not _under(p, "/usr"))


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _outermost(paths) -> list[str]:
    out: list[str] = []
    for p in sorted(set(paths)):
        if not any(_under(p, q) for q in out):
            out.append(p)
    return out


def _rlimits(limits: Limits, data_not_as: bool, pids_cgroup: bool = False) -> list[tuple[int, int, int, str]]:
    """(resource, soft, hard, prlimit option); pids_cgroup: the tree's processes are bounded by its own group, which
    they cannot leave (bubblewrap's cgroup namespace, or a uid other than this process's that cannot write the
    cgroup files), not by the uid's count that other runs share."""
    mem = (resource.RLIMIT_DATA, "--data") if data_not_as else (resource.RLIMIT_AS, "--as")
    cpu = int(limits.cpu_seconds)
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1] if pids_cgroup else limits.processes
    return [
        (resource.RLIMIT_CPU, cpu, cpu + 1, "--cpu"),
        (mem[0], limits.memory_bytes, limits.memory_bytes, mem[1]),
        (resource.RLIMIT_NPROC, nproc, nproc, "--nproc"),
        (resource.RLIMIT_FSIZE, limits.file_size_bytes, limits.file_size_bytes, "--fsize"),
        (resource.RLIMIT_NOFILE, limits.open_files, limits.open_files, "--nofile"),
        (resource.RLIMIT_CORE, 0, 0, "--core"),
    ]


class Sandbox:
    def __init__(
        self,
        workdir: str,
        limits: Limits,
        *,
        devices: Sequence[str] | None = None,
        uid: int | None = NOBODY,
        ro_paths: Sequence[str] = (),
    ):
        """devices: GPU indices to expose (None: no GPU handling; [] hides all GPUs).
        uid: host uid to run as when we are root (None: stay root; only sensible for tests).
        ro_paths: extra host paths bound read-only at the same path (bubblewrap only)."""
        self.workdir, self.limits = os.path.realpath(workdir), limits
        self.devices = None if devices is None else [str(d) for d in devices]
        self.uid = uid if _privileged() else None
        self.ro_paths = [os.path.realpath(p) for p in ro_paths]
        self.mode = _mode()
        bwrap = _bwrap_path() if self.mode != "none" else None
        err = "bwrap not found on PATH" if bwrap is None else _bwrap_error(bwrap, _privileged())
        if self.mode == "require" and err:
            raise SandboxUnavailable(f"KERNELBOT_SANDBOX=require but bubblewrap is unusable: {err}")
        self.bwrap = None if err else bwrap
        self.fallback_reason = "" if self.bwrap else ("KERNELBOT_SANDBOX=none" if self.mode == "none" else err)
        # without bubblewrap's mounts another uid could not even start the interpreter or enter the run directory
        closed = [f"{what} lies under {at}, which other users cannot enter" for what, path in
                  (("the interpreter", sys.executable), ("the run directory", os.path.dirname(self.workdir)))
                  if not self.bwrap and self.uid is not None and (at := _closed_to_others(path))]
        if closed:
            self.uid = None
            self.fallback_reason += f"; {'; '.join(closed)}, so runs keep this process's uid (install bubblewrap to " \
                                    "drop it)"
        self.tree_memory = tree_memory_limit(limits)
        self.cpus = cpu_limit(limits, len(self.devices or ()))
        self.cgroup: MemoryParent | None = None
        self.cgroup_error = "KERNELBOT_SANDBOX=none"
        if self.mode != "none":
            try:
                self.cgroup, self.cgroup_error = memory_parent(), ""
            except CgroupUnavailable as e:
                self.cgroup_error = str(e)
        if self.mode == "require" and self.cgroup_error:
            raise SandboxUnavailable(
                f"KERNELBOT_SANDBOX=require but no memory cgroup is usable ({self.cgroup_error}); run the "
                "harness as root or set KERNELBOT_CGROUP to a cgroup delegated to it")

    def describe(self) -> dict:
        bw = self.bwrap is not None
        uid = (self.uid if self.uid is not None else 0) if _privileged() else os.getuid()
        return {
            "backend": "bubblewrap" if bw else "rlimits-only",
            "network": "isolated" if bw else "host",
            "filesystem": "workdir rw, system+python ro, rest hidden" if bw else "host (protected only by file modes)",
            "pid_namespace": bw,
            "ipc_namespace": bw,
            "uid": uid,
            "uid_dropped": _privileged() and self.uid is not None,
            "rlimits": [opt.lstrip("-") for *_, opt in _rlimits(self.limits, self._data_not_as())],
            "env": "scrubbed",
            "tree_kill": "pid namespace" if bw else ("cgroup" if self.cgroup else "process group only"),
            "memory": {"cgroup": self.cgroup.version, "tree_limit_bytes": self.tree_memory} if self.cgroup else
            {"cgroup": None, "tree_limit_bytes": None, "per_process_only": self.cgroup_error},
            "processes": {"limit": self.limits.processes,
                          "bound_by": ("pids cgroup" if self._confined() else "pids cgroup and RLIMIT_NPROC (per uid)")
                          if self.cgroup and self.cgroup.pids else "RLIMIT_NPROC (per uid)"},
            "process_count": process_count_limit(self.limits, self.cpus) if self.cgroup else None,
            "cpu": self._cpu_containment(),
            "disk_limit_bytes": self.limits.disk_bytes or None,
            "devices": self._device_nodes() if bw else [],
            "mode": self.mode,
            **({"fallback_reason": self.fallback_reason} if not bw else {}),
        }

    def _cpu_containment(self) -> dict:
        """The tree's CPU limit and what enforces it: the cpu cgroup, else only a lower priority and RLIMIT_CPU."""
        if self.cgroup and self.cgroup.cpu:
            return {"limit_cores": self.cpus, "of_cores": node_cores(),
                    "bound_by": f"cpu cgroup {self.cgroup.version} ({self.cgroup.cpu})"}
        why = self.cgroup_error or f"no cpu controller is usable beside the memory cgroup {self.cgroup}"
        return {"limit_cores": None, "of_cores": node_cores(),
                "bound_by": f"nice {NICE} and RLIMIT_CPU {self.limits.cpu_seconds} s per process only ({why})"}

    def _confined(self) -> bool:
        """The tree cannot move itself to another cgroup: bubblewrap hides the cgroup files, or the uid it runs as is
        not this process's (which owns them). Without either its pids cgroup is no bound: RLIMIT_NPROC stays."""
        return self.bwrap is not None or self.uid is not None

    def _data_not_as(self) -> bool:
        return bool(self.devices)

    def _device_nodes(self) -> list[str]:
        if not self.devices:
            return []
        names = [f"nvidia{d}" for d in self.devices] + [
            "nvidiactl",
            "nvidia-uvm",
            "nvidia-uvm-tools",
            "nvidia-modeset",
        ]
        return [f"/dev/{n}" for n in names if os.path.exists(f"/dev/{n}")]

    def _env(self, env: dict[str, str] | None) -> dict[str, str]:
        pydir = os.path.dirname(sys.executable)
        out = {
            "PATH": f"{pydir}:/usr/local/bin:/usr/bin:/bin",
            "HOME": self.workdir,
            "TMPDIR": self.workdir,
            "LANG": "C.UTF-8",
            **(env or {}),
        }
        if self.devices is not None:
            out["CUDA_VISIBLE_DEVICES"] = ",".join(self.devices)
        return out

    def prepare_workdir(self) -> None:
        if self.uid is None:
            return
        for root, dirs, files in os.walk(self.workdir):
            for name in dirs + files:
                os.chown(os.path.join(root, name), self.uid, self.uid, follow_symlinks=False)
        os.chown(self.workdir, self.uid, self.uid)
        os.chmod(self.workdir, 0o700)

    def _bwrap_argv(self, argv: list[str], data_fds: list[int]) -> list[str]:
        a = [self.bwrap, *_namespace_args(_privileged()), "--ro-bind", "/usr", "/usr"]
        for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            p = f"/{name}"
            if os.path.islink(p):
                a += ["--symlink", os.readlink(p), p]
            elif os.path.isdir(p):
                a += ["--ro-bind", p, p]
        a += ["--perms", "0755", "--dir", "/etc"]
        for p in (
            "/etc/ld.so.cache",
            "/etc/ld.so.conf",
            "/etc/ld.so.conf.d",
            "/etc/alternatives",
            "/etc/localtime",
        ):
            if os.path.exists(p):
                a += ["--ro-bind", p, p]
        uid = self.uid if self.uid is not None else os.getuid()
        for path, text in (
            ("/etc/passwd", f"sandbox:x:{uid}:{uid}:sandbox:{self.workdir}:/usr/sbin/nologin\n"),
            ("/etc/group", f"sandbox:x:{uid}:\n"),
            # the private loopback by name: torch.distributed rendezvous on localhost (or the hostname) must
            # resolve without DNS, which the sandbox does not have
            ("/etc/hosts", "127.0.0.1 localhost sandbox\n::1 localhost ip6-localhost\n"),
            ("/etc/nsswitch.conf", "passwd: files\ngroup: files\nhosts: files\n"),
        ):
            r, w = os.pipe()
            os.write(w, text.encode())
            os.close(w)
            data_fds.append(r)
            a += ["--perms", "0444", "--ro-bind-data", str(r), path]
        a += ["--proc", "/proc", "--dev", "/dev", "--perms", "0555", "--dir", "/tmp"]
        a += ["--perms", "1777", "--size", str(self.limits.shm_bytes), "--tmpfs", "/dev/shm"]
        # bwrap copies the modes of the host's parent dirs (/root is 0700): make them traversable
        made = {"/", "/usr", "/etc", "/tmp", "/dev", "/proc"}

        def parents(path: str) -> list[str]:
            out, parent = [], os.path.dirname(path)
            while parent not in made:
                made.add(parent)
                out[:0] = ["--perms", "0755", "--dir", parent]
                parent = os.path.dirname(parent)
            return out

        for p in _outermost([*_python_paths(), *self.ro_paths]):
            a += [*parents(p), "--ro-bind", p, p]
        for dev in self._device_nodes():
            a += ["--dev-bind", dev, dev]
        a += [*parents(self.workdir), "--bind", self.workdir, self.workdir, "--chdir", self.workdir]
        a += ["--remount-ro", "/dev", "--remount-ro", "/", "--"]  # only the workdir and /dev/shm stay writable
        if self.uid is not None:
            a += [
                "setpriv",
                f"--reuid={self.uid}",
                f"--regid={self.uid}",
                "--clear-groups",
                "--bounding-set=-all",
                "--inh-caps=-all",
                "--no-new-privs",
                "--",
            ]
        return a + list(argv)

    def start(self, argv: list[str], env: dict[str, str] | None = None, pass_fds=(), *,
              clock: bool = True) -> SandboxedProcess:
        """clock=False: the wall-time limit starts only with restart_clock (a spare started ahead of its run)."""
        self.prepare_workdir()
        data_fds: list[int] = []
        group = self.cgroup.create(self.tree_memory, self.limits.processes, self.cpus) if self.cgroup else None
        nice = not (group and group.cpus)
        limits = _rlimits(self.limits, self._data_not_as(), bool(group and group.pids_path) and self._confined())
        procs_fds = group.open_procs() if group else []
        try:
            cmd = self._bwrap_argv(argv, data_fds) if self.bwrap else list(argv)
            prlimit = shutil.which("prlimit")
            if prlimit:
                cmd = [prlimit, *(f"{opt}={'unlimited' if soft == resource.RLIM_INFINITY else soft}:"
                                  f"{'unlimited' if hard == resource.RLIM_INFINITY else hard}"
                                  for _, soft, hard, opt in limits), "--", *cmd]

            def preexec() -> None:
                for fd in procs_fds:  # join the run's cgroups before anything is exec'd
                    os.write(fd, b"0")
                if nice:
                    os.nice(NICE)
                if not prlimit:
                    for res, soft, hard, _ in limits:
                        resource.setrlimit(res, (soft, hard))

            drop = {} if self.bwrap or self.uid is None else {"user": self.uid, "group": self.uid, "extra_groups": []}
            started = time.monotonic()
            proc = subprocess.Popen(
                cmd,
                cwd=self.workdir,
                env=self._env(env),
                pass_fds=(*pass_fds, *data_fds),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=preexec if procs_fds or nice or not prlimit else None,
                **drop,
            )
        except BaseException:
            if group:
                group.remove()
            raise
        finally:
            for fd in (*data_fds, *procs_fds):
                os.close(fd)
        return SandboxedProcess(proc, self.limits, started, bwrap=self.bwrap is not None, group=group, clock=clock,
                                workdir=self.workdir, process_count=process_count_limit(self.limits, self.cpus))


class _Capture(threading.Thread):
    """Reads a pipe to EOF, keeping the first `cap` bytes and discarding the rest."""

    def __init__(self, stream, cap: int):
        super().__init__(daemon=True)
        self.stream, self.cap, self.buf, self.total = stream, cap, bytearray(), 0
        self.start()

    def run(self) -> None:
        fd = self.stream.fileno()
        try:
            while chunk := os.read(fd, _CHUNK):
                self.total += len(chunk)
                if len(self.buf) < self.cap:
                    self.buf += chunk[: self.cap - len(self.buf)]
        except OSError:
            pass
        finally:
            self.stream.close()

    @property
    def truncated(self) -> bool:
        return self.total > len(self.buf)

    def text(self) -> str:
        return bytes(self.buf[: self.cap]).decode(errors="replace")


_SIGNAL_REASONS = {
    signal.SIGXCPU: "CPU time limit exceeded (SIGXCPU)",
    signal.SIGXFSZ: "file size limit exceeded (SIGXFSZ)",
    signal.SIGKILL: "killed (SIGKILL: CPU hard limit, OOM killer or kill())",
}


class SandboxedProcess:
    def __init__(self, proc: subprocess.Popen, limits: Limits, started: float | None = None, *, bwrap: bool = False,
                 group: MemoryGroup | None = None, clock: bool = True, workdir: str | None = None,
                 process_count: int = 0):
        """process_count: the processes (not threads) its group may hold at once; 0: unwatched."""
        self.proc, self.limits, self.bwrap, self.group, self.workdir = proc, limits, bwrap, group, workdir
        self.process_count, self.processes_held = process_count, 0  # held: the count that ended it, when it did
        self.started = time.monotonic() if started is None else started
        self.timed_out, self.killed, self.memory_exceeded, self.disk_exceeded = False, False, False, False
        self.processes_exceeded, self.cpu_throttled_s = False, 0.0
        self._exited = threading.Event()
        self._lock = threading.Lock()
        self._out = _Capture(proc.stdout, limits.output_bytes)
        self._err = _Capture(proc.stderr, limits.output_bytes)
        # the watchdog runs even if nobody is in wait() yet (the parent may be busy on a protocol pipe); a spare's
        # starts with its run (restart_clock)
        self._timer: threading.Timer | None = None
        if clock:
            self._arm(max(0.0, self.started + limits.wall_seconds - time.monotonic()))
        if group is not None:
            threading.Thread(target=self._watch_memory, daemon=True).start()
        if workdir is not None:
            threading.Thread(target=self._watch_disk, daemon=True).start()
        self._outcome: Outcome | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _arm(self, seconds: float) -> None:
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def restart_clock(self, limits: Limits) -> None:
        """A process started ahead of its run (a spare) gets its run's limits, and its wall time counts from now."""
        if self._timer is not None:
            self._timer.cancel()
        self.limits, self.started = limits, time.monotonic()
        self._arm(limits.wall_seconds)

    def _expire(self) -> None:
        with self._lock:
            if self.proc.poll() is None:
                self.timed_out = True
                self._kill()

    def _watch_memory(self) -> None:
        """The kernel's OOM killer takes one process (v1) or the group (v2): finish the rest of the tree. A fork the
        task limit refused, or more processes than process_count, ends the tree too."""
        assert self.group is not None
        while not self._exited.wait(MEMORY_POLL_S):
            oom, forks = self.group.oom_kills(), self.group.forks_refused()
            held = len(self.group.pids()) if self.process_count and not (oom or forks) else 0
            if oom or forks or held > self.process_count:
                with self._lock:
                    self.processes_held = held
                    self.memory_exceeded, self.processes_exceeded = bool(oom), not oom
                    if self.proc.poll() is None:
                        self._kill()
                    self.group.kill()  # the kernel refuses forks, it does not end the tree
                return

    def _watch_disk(self) -> None:
        """The workdir's files together may take `disk_bytes` (a spare's limits are its run's from restart_clock)."""
        assert self.workdir is not None
        while not self._exited.wait(DISK_POLL_S):
            if self.limits.disk_bytes and disk_usage(self.workdir) > self.limits.disk_bytes:
                with self._lock:
                    self.disk_exceeded = True
                    if self.proc.poll() is None:
                        self._kill()
                return

    def kill(self) -> None:
        with self._lock:
            if self.proc.poll() is None:
                self.killed = True
            self._kill()

    def _kill(self) -> None:
        # Under bwrap the pid namespace dies with its init, which dies (PDEATHSIG) with this process.
        # send_signal is a no-op once Popen has reaped the pid, so a recycled pid is never hit.
        self.proc.send_signal(signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def wait(self) -> Outcome:
        if self._outcome is not None:
            return self._outcome
        rc = self.proc.wait()
        elapsed = time.monotonic() - self.started
        self._exited.set()
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            self._kill()  # leftovers in our process group (fallback) once the main process is gone
        if self.group is not None:
            self.memory_exceeded = self.memory_exceeded or self.group.oom_kills() > 0
            self.processes_exceeded = not self.memory_exceeded and (
                self.processes_exceeded or self.group.forks_refused() > 0)
            self.cpu_throttled_s = self.group.throttled_seconds()
            self.group.remove()  # kills what is left in the group, however detached, then removes it
        # EOF comes at once unless something outside our reach still holds the pipes (fallback: a
        # setsid'd grandchild); never hang on it, the reader threads keep draining and close them.
        deadline = time.monotonic() + (5.0 if self.bwrap else 2.0)
        for cap in (self._out, self._err):
            cap.join(timeout=max(0.0, deadline - time.monotonic()))
        escaped = self._out.is_alive() or self._err.is_alive()
        if self.bwrap and 128 < rc < 128 + signal.NSIG:
            rc = -(rc - 128)  # bwrap's init reports a signalled child as 128 + signo
        if self.memory_exceeded:
            assert self.group is not None
            reason = (f"memory limit exceeded: the run's processes together reached its {self.group.limit >> 20} MiB "
                      "limit and were killed")
        elif self.processes_exceeded and self.processes_held:
            reason = (f"process limit exceeded: the run held {self.processes_held} processes at once, more than its "
                      f"{self.process_count}, and its processes were killed")
        elif self.processes_exceeded:
            assert self.group is not None
            reason = (f"process limit exceeded: the run tried to start more than {self.group.processes} processes "
                      "and threads together and its processes were killed")
        elif self.disk_exceeded:
            reason = (f"disk limit exceeded: the run's files in its working directory passed its "
                      f"{self.limits.disk_bytes >> 20} MiB limit and its processes were killed")
        elif self.timed_out:
            reason = f"wall time exceeded ({self.limits.wall_seconds:g} s)"
        elif self.killed:
            reason = "killed by the parent"
        elif rc < 0:
            sig = signal.Signals(-rc)
            reason = _SIGNAL_REASONS.get(sig, f"killed by {sig.name}")
        else:
            reason = "a descendant escaped the sandbox and still holds its output" if escaped else ""
        self._outcome = Outcome(
            rc,
            self._out.text(),
            self._err.text(),
            self.timed_out,
            reason,
            self._out.truncated,
            self._err.truncated,
            elapsed,
            self.memory_exceeded,
            self.disk_exceeded,
            self.processes_exceeded,
            self.cpu_throttled_s,
        )
        return self._outcome


def describe(devices: Sequence[str] | None = None) -> dict:
    """Protections a Sandbox built now (default limits) would have on this machine."""
    try:
        return Sandbox(os.getcwd(), Limits(), devices=devices).describe()
    except SandboxUnavailable as e:
        return {"backend": "unavailable", "mode": "require", "error": str(e)}
