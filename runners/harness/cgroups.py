"""A memory limit on a whole process tree, enforced by the kernel: one memory cgroup per sandboxed run.

    parent = memory_parent()                  # MemoryParent, or raises CgroupUnavailable(why)
    group = parent.create(limit_bytes)        # a fresh child group with the limit set
    fd = group.open_procs()                   # the forked child writes "0" here before exec: the whole
                                              # tree is inside from its first instruction
    group.oom_kills(), group.kill(), group.remove()

Both hierarchies behind the same interface: cgroup v2 (`memory.max`, `memory.swap.max`, `memory.oom.group`,
`memory.events`) and the v1 memory controller (`memory.limit_in_bytes`, `memory.memsw.limit_in_bytes`,
`memory.oom_control`). The parent is `KERNELBOT_CGROUP` when set (a cgroup directory this process may create
groups in: v2 with `memory` in its `cgroup.subtree_control`, or a v1 memory-controller directory; several separated
by ":", the first that exists and is usable), else the group this process itself is in (v2 when `memory` is enabled
for its children, else the v1 memory controller). Groups are nested there, so the run stays accounted (and limited)
wherever the runner itself is.

Processes of the whole tree (`create(limit, processes=N)`): the pids controller's `pids.max` in the same group (v2,
where `pids` is in the parent's `cgroup.subtree_control`) or in a group of the same name in the v1 pids hierarchy
(the parent's path there: the runner's own pids group, or KERNELBOT_CGROUP's path under the pids mount); a fork past
it fails and `pids.events` counts it (`group.forks_refused()`). Without a usable pids controller the run has none.

CPU of the whole tree (`create(..., cpus=C)`): the cpu controller's bandwidth limit, C cores' worth of time every
CPU_PERIOD_US, in the same group (v2 `cpu.max`, where `cpu` is in the parent's `cgroup.subtree_control`) or in a
group of the same name in the v1 cpu hierarchy (`cpu.cfs_period_us`/`cpu.cfs_quota_us`); the tree also weighs as one
task against the host's processes there, however many it forks. Without a usable cpu controller the run has none
(`group.cpus` is 0; sandbox.py then lowers its priority instead).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import re
import signal
import time

_counter = itertools.count()
PREFIX = "kernelbot-"
CPU_PERIOD_US = 100_000
MIN_QUOTA_US = 1_000  # the kernel's floor for a quota


class CgroupUnavailable(RuntimeError):
    """No memory cgroup this process may create groups in."""


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _field(text: str, key: str) -> int:
    """`key N` from a flat-keyed cgroup file (memory.events, memory.oom_control)."""
    match = re.search(rf"^{key} (\d+)$", text, re.MULTILINE)
    return int(match.group(1)) if match else 0


def _own_groups(controller: str = "memory") -> dict[str, tuple[str, str]]:
    """version -> (mount point, this process's group directory) from /proc/self/{cgroup,mountinfo}; v1: the
    `controller`'s hierarchy."""
    paths: dict[str, str] = {}
    for line in _read("/proc/self/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            paths["v2"] = path
        elif controller in controllers.split(","):
            paths["v1"] = path
    found: dict[str, tuple[str, str]] = {}
    for line in _read("/proc/self/mountinfo").splitlines():
        pre, _, post = line.partition(" - ")
        fields, (fstype, _source, options) = pre.split(), post.split()[:3]
        root, mount = fields[3], fields[4]
        version = "v2" if fstype == "cgroup2" else "v1" if fstype == "cgroup" and controller in options.split(",") \
            else ""
        if version and version in paths and version not in found:
            rel = os.path.relpath(paths[version], root)
            if not rel.startswith(".."):
                found[version] = (mount, os.path.normpath(os.path.join(mount, rel)))
    return found


def _usable(version: str, directory: str) -> str:
    """"" if we may create memory-limited groups in `directory`, else why not."""
    if version == "v2":
        try:
            enabled = _read(os.path.join(directory, "cgroup.subtree_control")).split()
        except OSError as exc:
            return f"cgroup v2 at {directory}: {exc.strerror}"
        if "memory" not in enabled:
            return f"cgroup v2: memory is not enabled in {directory}/cgroup.subtree_control"
    elif not os.path.exists(os.path.join(directory, "memory.limit_in_bytes")):
        return f"cgroup v1: {directory} is not a memory-controller group"
    if not os.access(directory, os.W_OK):
        return f"cgroup {version}: {directory} is not writable by uid {os.geteuid()}"
    return ""


class MemoryGroup:
    def __init__(self, path: str, version: str, limit: int, pids_path: str | None = None, processes: int = 0,
                 cpu_path: str | None = None, cpus: float = 0.0):
        """pids_path / cpu_path: the group holding its process / CPU limit (v2: `path` itself; v1: the pids / cpu
        hierarchy's), if any; cpus: its CPU limit in cores (0: none)."""
        self.path, self.version, self.limit = path, version, limit
        self.pids_path, self.processes = pids_path, processes
        self.cpu_path, self.cpus = cpu_path, cpus
        self.unthrottled = False

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def _twins(self) -> list[str]:
        """Its groups in other v1 hierarchies (pids, cpu)."""
        return list(dict.fromkeys(p for p in (self.pids_path, self.cpu_path) if p and p != self.path))

    def open_procs(self) -> list[int]:
        """What the forked child writes "0" to: the group, and its v1 pids and cpu groups."""
        return [os.open(os.path.join(p, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC) for p in [self.path,
                                                                                               *self._twins()]]

    def cpu_stat(self) -> dict[str, int]:
        """Its cpu controller's `cpu.stat` (v2: usage_usec, throttled_usec, ...; v1: nr_throttled, throttled_time
        in ns, ...); {} without one."""
        if not self.cpu_path:
            return {}
        try:
            text = _read(os.path.join(self.cpu_path, "cpu.stat"))
        except OSError:
            return {}
        return {key: int(value) for key, value in re.findall(r"^(\w+) (\d+)$", text, re.MULTILINE)}

    def throttled_seconds(self) -> float:
        """How long the tree waited, all its CPUs together, because it had used its CPU quota."""
        stat = self.cpu_stat()
        return stat.get("throttled_usec", 0) / 1e6 if self.version == "v2" else stat.get("throttled_time", 0) / 1e9

    def unthrottle(self) -> None:
        """Lift the CPU limit: a killed tree exits (frees its memory, unmaps torch) at full speed."""
        if self.cpu_path and self.cpus and not self.unthrottled:
            self.unthrottled = True
            with contextlib.suppress(OSError):
                if self.version == "v2":
                    _write(os.path.join(self.cpu_path, "cpu.max"), "max")
                else:
                    _write(os.path.join(self.cpu_path, "cpu.cfs_quota_us"), "-1")

    def forks_refused(self) -> int:
        """Forks the process limit refused (pids.events `max`)."""
        if not self.pids_path:
            return 0
        try:
            return _field(_read(os.path.join(self.pids_path, "pids.events")), "max")
        except OSError:
            return 0

    def oom_kills(self) -> int:
        """Processes the kernel killed because the group hit its limit."""
        name = "memory.events" if self.version == "v2" else "memory.oom_control"
        try:
            return _field(_read(self._file(name)), "oom_kill")
        except OSError:
            return 0

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in _read(self._file("cgroup.procs")).split()]
        except OSError:
            return []

    def kill(self) -> None:
        """SIGKILL every process in the group, however it was forked or detached."""
        self.unthrottle()
        if self.version == "v2" and os.path.exists(self._file("cgroup.kill")):
            with contextlib.suppress(OSError):
                _write(self._file("cgroup.kill"), "1")
            return
        for _ in range(100):  # v1: new processes may be forked while we kill; a few rounds empty it
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def remove(self, timeout: float = 5.0) -> bool:
        self.kill()
        deadline = time.monotonic() + timeout
        for path in [self.path, *self._twins()]:
            while True:
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        return False
                    self.kill()
                    if path != self.path:  # v1: what is left in the pids or cpu group
                        for pid in MemoryGroup(path, "v1", 0).pids():
                            with contextlib.suppress(ProcessLookupError, PermissionError):
                                os.kill(pid, signal.SIGKILL)
                    time.sleep(0.02)
        return True


class MemoryParent:
    def __init__(self, version: str, path: str, pids: str | None = None, cpu: str | None = None):
        """pids / cpu: where process- / CPU-limited groups go (v2: `path`, when it may; v1: a directory of the pids /
        cpu hierarchy), or None."""
        self.version, self.path, self.pids, self.cpu = version, path, pids, cpu

    def __str__(self) -> str:
        return f"{self.version} {self.path}"

    def create(self, limit: int, processes: int = 0, cpus: float = 0.0) -> MemoryGroup:
        """A fresh group with the memory limit and, where a pids / cpu controller is usable, at most `processes`
        tasks / `cpus` cores. A CPU limit the kernel refuses (v1: above a limit of the parent's own) is left out."""
        self._remove_stale()
        name = f"{PREFIX}{os.getpid()}-{next(_counter)}-{time.monotonic_ns()}"
        path = os.path.join(self.path, name)
        os.mkdir(path, 0o755)
        pids_path = os.path.join(self.pids, name) if self.pids and processes else None
        cpu_path = os.path.join(self.cpu, name) if self.cpu and cpus > 0 else None
        group = MemoryGroup(path, self.version, limit, pids_path, processes, cpu_path, cpus if cpu_path else 0.0)
        try:
            for twin in group._twins():
                os.mkdir(twin, 0o755)
            if pids_path:
                _write(os.path.join(pids_path, "pids.max"), str(processes))
            if cpu_path:
                try:
                    _set_cpu_limit(self.version, cpu_path, cpus)
                except OSError:
                    group.cpus = 0.0
            if self.version == "v2":
                _write(group._file("memory.max"), str(limit))
                _write(group._file("memory.oom.group"), "1")  # an OOM kills the whole tree, not one process
                optional = {"memory.swap.max": "0"}
            else:
                _write(group._file("memory.limit_in_bytes"), str(limit))
                optional = {"memory.memsw.limit_in_bytes": str(limit)}  # memory + swap, where accounted
            for name, value in optional.items():
                if os.path.exists(group._file(name)):
                    _write(group._file(name), value)
        except OSError:
            group.remove()
            raise
        return group

    def _remove_stale(self) -> None:
        """Groups left by a runner that died before removing them (empty once their processes are gone)."""
        for parent in {self.path, self.pids or self.path, self.cpu or self.path}:
            with contextlib.suppress(OSError):
                for name in os.listdir(parent):
                    match = re.fullmatch(rf"{PREFIX}(\d+)-\d+-\d+", name)
                    if match and not _alive(int(match.group(1))):
                        with contextlib.suppress(OSError):
                            os.rmdir(os.path.join(parent, name))


def _set_cpu_limit(version: str, path: str, cpus: float) -> None:
    quota = max(MIN_QUOTA_US, round(cpus * CPU_PERIOD_US))
    if version == "v2":
        _write(os.path.join(path, "cpu.max"), f"{quota} {CPU_PERIOD_US}")
    else:
        _write(os.path.join(path, "cpu.cfs_period_us"), str(CPU_PERIOD_US))
        _write(os.path.join(path, "cpu.cfs_quota_us"), str(quota))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def memory_parent() -> MemoryParent:
    return _memory_parent(os.environ.get("KERNELBOT_CGROUP", "").strip())


@functools.cache
def _memory_parent(configured: str) -> MemoryParent:
    """Probed once per process and setting: create, limit and remove a group."""
    if configured:  # one path, or several separated by ":" (one unit file for v2 and v1 hosts): the first usable
        paths = [p for p in configured.split(":") if p]
        existing = [p for p in paths if os.path.isdir(p)] or paths[-1:]
        candidates = [("v2" if os.path.exists(os.path.join(p, "cgroup.controllers")) else "v1", os.path.realpath(p))
                      for p in existing]
    else:
        try:
            own = _own_groups()
        except (OSError, ValueError, IndexError) as exc:
            raise CgroupUnavailable(f"cannot read this process's cgroups: {exc}") from None
        candidates = [(v, own[v][1]) for v in ("v2", "v1") if v in own]
        if not candidates:
            raise CgroupUnavailable("no cgroup v2 or v1 memory hierarchy is mounted")
    problems = []
    for version, directory in candidates:
        if problem := _usable(version, directory):
            problems.append(problem)
            continue
        parent = MemoryParent(version, directory)
        try:
            parent.create(1 << 30).remove()
        except OSError as exc:
            problems.append(f"cgroup {version}: cannot create a group in {directory}: {exc}")
            continue
        parent.pids = _twin_parent("pids", version, directory, configured)
        parent.cpu = _twin_parent("cpu", version, directory, configured)
        return parent
    raise CgroupUnavailable("; ".join(problems))


def _twin_parent(controller: str, version: str, directory: str, configured: str) -> str | None:
    """Where groups limited by `controller` (pids, cpu) go beside memory parent `directory`: itself (v2, the
    controller enabled there), or the same path in the v1 controller's hierarchy (the configured memory path's, else
    this process's own group there); None where no group there takes a limit."""
    if version == "v2":
        with contextlib.suppress(OSError):
            if controller in _read(os.path.join(directory, "cgroup.subtree_control")).split():
                return directory
        return None
    try:
        own = _own_groups(controller).get("v1")
        memory = _own_groups("memory").get("v1")
    except (OSError, ValueError, IndexError):
        return None
    if own is None:
        return None
    candidate = own[1]
    if configured and memory is not None:
        rel = os.path.relpath(directory, memory[0])
        candidate = os.path.normpath(os.path.join(own[0], rel))
    if not os.path.exists(os.path.join(candidate, "cgroup.procs")):
        return None
    name = os.path.join(candidate, f"{PREFIX}{os.getpid()}-probe-{time.monotonic_ns()}")
    try:
        os.mkdir(name)
        try:
            if controller == "pids":
                _write(os.path.join(name, "pids.max"), "16")
            else:
                _set_cpu_limit("v1", name, 1.0)
        finally:
            os.rmdir(name)
    except OSError:
        return None
    return candidate


class HoldGroups:
    """Each reservation's processes in a cgroup of its own, `kernelbot-<installation>-reservation-<id>` beside the
    runs' groups: a holder's login joins it (hold.py) and the agent kills it whole when the reservation ends. The
    installation's key is in the name, so agents of other installations on the machine never touch it."""

    def __init__(self, parent: MemoryParent, key: str):
        self.version, self.parent, self.key = parent.version, parent.path, key

    def path(self, rid: int) -> str:
        return os.path.join(self.parent, f"{PREFIX}{self.key}-reservation-{int(rid)}")

    def ensure(self, rid: int) -> str:
        """The reservation's group, created when missing; "" when it cannot be."""
        path = self.path(rid)
        try:
            os.makedirs(path, 0o755, exist_ok=True)
        except OSError:
            return ""
        return path

    def groups(self) -> dict[int, str]:
        """reservation id → group of this installation's reservations that have one now."""
        found = {}
        with contextlib.suppress(OSError):
            for name in os.listdir(self.parent):
                match = re.fullmatch(rf"{PREFIX}{re.escape(self.key)}-reservation-(\d+)", name)
                if match:
                    found[int(match.group(1))] = os.path.join(self.parent, name)
        return found

    def pids(self, rid: int) -> list[int]:
        return MemoryGroup(self.path(rid), self.version, 0).pids()

    def end(self, active: set[int]) -> dict[int, list[int]]:
        """Kill and remove the group of every reservation of this installation not in `active`: what each held."""
        ended = {}
        for rid, path in self.groups().items():
            if rid not in active:
                group = MemoryGroup(path, self.version, 0)
                ended[rid] = group.pids()
                group.remove()
        return ended


def hold_groups(key: str) -> HoldGroups | None:
    """Reservations' groups for installation `key`: beside the runs' (their memory parent), else in KERNELBOT_CGROUP
    where it is writable (they need no controller); None where no cgroup is usable."""
    try:
        return HoldGroups(memory_parent(), key)
    except CgroupUnavailable:
        for path in filter(None, os.environ.get("KERNELBOT_CGROUP", "").strip().split(":")):
            if os.access(os.path.join(path, "cgroup.procs"), os.W_OK):
                version = "v2" if os.path.exists(os.path.join(path, "cgroup.controllers")) else "v1"
                return HoldGroups(MemoryParent(version, os.path.realpath(path)), key)
        return None

