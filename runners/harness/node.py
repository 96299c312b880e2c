"""The node agent: the one thing that runs kernels on a machine. Run it as a service on every machine of a pool with
backend "local" (`./dev serve` starts one for this machine):

    KERNELBOT_NODE_TOKEN=… python -m runners.harness.node --platform https://kb.example.org --pool lab

Stdlib only, Django-free, shipped in `harness.tar.gz` with the remote agent. It probes the machine (its real
devices, never typed in) and registers them with the platform, then waits for work: `nodes/wait` is held open by the
platform until there is news for this node (a run for a free device, a reservation) or for `--wait` seconds (its
heartbeat), then asked again at once; a platform that answers at once (an older one, or one not served by ASGI) is
asked every `--poll` seconds, as `nodes/poll` was. The platform hands it runs of its pool for its free devices
(`/api/runner/v1/nodes/…`, Bearer: the node's token, HMAC-SHA256(key, "node:pool:hostname"), printed by `manage.py
node_token`; an agent beside the platform may derive it from KERNELBOT_RUNNER_KEY instead). Each claim carries its
attempt's token; the run goes through the same per-attempt routes and the same harness runner as the remote agent
(`agent.run_attempt`), one thread per run, each beating its attempt while it runs. A restarted agent registers
again, and the platform retries at once the runs the previous one held.

Warm by default: torch and the harness are imported once, by a template process each run's trusted parent is forked
from (`runners.harness.warm`), and each device slot keeps a spare parent whose sandboxed child has started already,
so a run waits for neither interpreter (`--no-spares`, `--cold` to turn these off).

With `--authorized-keys PATH` (the agent's account's ~/.ssh/authorized_keys, say) it keeps there, for each reservation
active on this machine, its holder's SSH keys (the platform's poll answer), each line forced to a login shell or the
ssh command with CUDA_VISIBLE_DEVICES set to the reserved devices, and removes them when the reservation ends (its
lines only: each ends with its marker) or the agent stops. A holder's login (hold.py) joins a cgroup of its
reservation, which the agent kills whole when the reservation ends; where there is none, it stays the parent (a
child subreaper) of all the login starts, and the agent kills that tree. Tags and groups carry this installation's key
(from the node's token), so agents of other installations on the machine never touch them.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from . import agent
from .agent import KEY_ENV, Gone, Platform, Refused, Transport, http, run_attempt
from .cgroups import HoldGroups, hold_groups
from .device import descends_from
from .runner import Spares
from .warm import template

VERSION = "1"
NODE_TOKEN_ENV = "KERNELBOT_NODE_TOKEN"
POLL_S = 0.5
WAIT_S = 15.0  # the longest a wait for work is held open: the node's heartbeat
SWEEP_S = 2.0  # how often the devices nothing holds are checked for leftover processes
END_MARGIN_S = 0.05  # a reservation's end is asked about this long after it (its `ends_in`), so it is over then
SAMPLE_S = 15.0  # how often the devices' utilisation and memory are sampled (nvidia-smi) for the platform's /metrics
KEY_LINE = re.compile(r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh\.com|"
                      r"sk-ecdsa-sha2-nistp256@openssh\.com) [A-Za-z0-9+/]+={0,2}")
KEY_MARK = re.compile(r" kernelbot-node-agent-reservation-\d+$")
RESERVATION_ENV = "KERNELBOT_RESERVATION"  # set by a holder's SSH login: every process it starts inherits it
INSTALLATION_ENV = "KERNELBOT_INSTALLATION"  # beside it: the installation whose reservation it is
HOLD = Path(__file__).resolve().with_name("hold.py")


def installation_key(token: str) -> str:
    """This installation's key on the machine: the node token's own (two installations never share a token)."""
    return hashlib.sha256(f"kernelbot-installation:{token}".encode()).hexdigest()[:16]


def key_lines(placed: list[dict], installation: str = "", groups: dict[int, str] | None = None) -> list[str]:
    """authorized_keys lines for the reservations' keys (checked again here: only a bare key of a known type passes),
    each forced into hold.py (a login shell or the ssh command, in the reservation's cgroup `groups[id]`) with the
    reservation's devices visible."""
    lines = []
    for entry in placed:
        rid, gpus = int(entry["reservation"]), ",".join(str(int(i)) for i in entry["gpus"])
        group = shlex.quote((groups or {}).get(rid, ""))
        command = (f"export CUDA_VISIBLE_DEVICES={gpus} {RESERVATION_ENV}={rid} {INSTALLATION_ENV}={installation}; "
                   f"exec {shlex.quote(sys.executable)} -I {shlex.quote(str(HOLD))} {group}")
        lines += [f'restrict,pty,command="{command}" {key} kernelbot-node-agent-reservation-{rid}'
                  for key in entry["keys"] if isinstance(key, str) and KEY_LINE.fullmatch(key)]
    return lines


def place_keys(path: Path, lines: list[str]) -> bool:
    """Make `path`'s agent lines exactly `lines` (others kept, the file created 0600 in a 0700 directory when
    missing), under a lock beside it, replaced whole; False when nothing changed."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(f"{path}.lock", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        old = path.read_text().splitlines() if path.exists() else []
        new = [line for line in old if not KEY_MARK.search(line)] + lines
        if new == old and path.exists():
            return False
        tmp = path.with_name(f"{path.name}.kernelbot.{os.getpid()}")
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write("".join(f"{line}\n" for line in new))
        os.replace(tmp, path)
        return True
    finally:
        os.close(fd)


def node_token(key: str, pool: str, hostname: str) -> str:
    return hmac.new(key.encode(), f"node:{pool}:{hostname}".encode(), hashlib.sha256).hexdigest()


def probe(python: str) -> dict:
    """This machine's probe, from the interpreter that runs the harness (its torch is the one runs get)."""
    done = subprocess.run([python, "-m", "runners.harness.probe"], cwd=Path(__file__).resolve().parents[2],
                          capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the device probe ({python} -m runners.harness.probe) failed: {done.stderr[-500:]}")
    return json.loads(done.stdout)


def compute_processes() -> dict[int, list[int]] | None:
    """Device index → pids with a compute context on it, from nvidia-smi; None where there is none."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None

    def query(what: str) -> list[list[str]]:
        done = subprocess.run([smi, f"--query-{what}", "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=30, check=False)
        return [[f.strip() for f in line.split(",")] for line in done.stdout.splitlines() if line.strip()]

    try:
        index_of = {bus.lower(): int(index) for index, bus in query("gpu=index,pci.bus_id")}
        found: dict[int, list[int]] = {}
        for pid, bus in query("compute-apps=pid,gpu_bus_id"):
            if bus.lower() in index_of and pid.isdigit():
                found.setdefault(index_of[bus.lower()], []).append(int(pid))
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    return found


def gpu_samples() -> list[dict] | None:
    """Each device's utilisation (0..1) and memory (bytes) now, from nvidia-smi; None where there is none."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run([smi, "--query-gpu=index,utilization.gpu,memory.used,memory.total",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10,
                              check=False)
        rows = [[f.strip() for f in line.split(",")] for line in done.stdout.splitlines() if line.strip()]
        return [{"index": int(index), "utilization": float(util) / 100, "memory_used": int(float(used)) << 20,
                 "memory_total": int(float(total)) << 20} for index, util, used, total in rows]
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def process_start(pid: int) -> int | None:
    """When the process started (clock ticks since boot): a pid and its start name one process, reused pids aside."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def tagged_processes(installation: str) -> dict[int, int]:
    """pid → reservation id of every process whose environment carries RESERVATION_ENV and this `installation`'s
    key (a holder's login and what it started without rewriting its environment), and of all their descendants."""
    found = {}
    mark, ours = f"{RESERVATION_ENV}=".encode(), f"{INSTALLATION_ENV}={installation}".encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        for item in environ:
            if item.startswith(mark) and item[len(mark):].isdigit() and ours in environ:
                found[int(entry.name)] = int(item[len(mark):])
    return {pid: rid for root, rid in found.items() for pid in process_tree([root])}


def process_tree(roots: list[int]) -> list[int]:
    """`roots` and all their descendants now (the ppid links in /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{entry.name}/stat") as f:
            children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    tree, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.append(pid)
            todo += children.get(pid, [])
    return tree


def stale_run_dirs(workroot: Path) -> list[Path]:
    """The run directories (`kernelbot-run-*`, holding a competitor's files) under `workroot` that no live process
    uses as its working directory, its HOME (a harness parent's) or through an open file: a killed agent's."""
    prefix = os.path.join(os.path.realpath(workroot), "kernelbot-run-")
    dirs = [p for p in Path(workroot).glob("kernelbot-run-*") if p.is_dir() and not p.is_symlink()]
    if not dirs:
        return []
    used: set[str] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        base = f"/proc/{entry.name}"
        paths = []
        with contextlib.suppress(OSError):
            paths.append(os.readlink(f"{base}/cwd"))
        with contextlib.suppress(OSError), open(f"{base}/environ", "rb") as f:
            paths += [item[5:].decode(errors="replace") for item in f.read().split(b"\0")
                      if item.startswith(b"HOME=")]
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"{base}/fd"):
                with contextlib.suppress(OSError):
                    paths.append(os.readlink(f"{base}/fd/{fd}"))
        used.update(path[len(prefix):].split("/", 1)[0] for path in paths if path.startswith(prefix))
    return [p for p in dirs if p.name.removeprefix("kernelbot-run-") not in used]


class NodeAgent:
    def __init__(self, platform: str, pool: str, hostname: str, token: str, *, python: str = sys.executable,
                 workroot: Path | None = None, poll_s: float = POLL_S, transport: Transport = http,
                 warm: bool = True, spares: bool = False, wait_s: float = WAIT_S):
        """warm: fork each run's harness parent from a template that imported torch once (runners.harness.warm);
        spares: also keep a parent per device slot started ahead of its run, its sandboxed child ready (Spares)."""
        self.platform, self.pool, self.hostname, self.token = platform.rstrip("/"), pool, hostname, token
        self.python, self.poll_s, self.wait_s, self.transport = python, poll_s, wait_s, transport
        self.workroot = workroot or Path(tempfile.gettempdir())
        self.warm = warm or spares
        self.sweep_s, self.swept = SWEEP_S, -SWEEP_S
        self.sampled = -SAMPLE_S
        root = str(Path(__file__).resolve().parents[2])
        self.spares = Spares(python, root, self.workroot) if spares else None
        if self.warm:
            template(python, root)  # starts importing now, not when the first run comes
        self.devices: list[int] = []
        self.busy: dict[int, tuple[int, int]] = {}  # device index → (run, attempt)
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.authorized_keys: Path | None = None  # where reservations' keys go (--authorized-keys)
        self.again = False  # the last wait ended with news: ask again at once
        self.owned: dict[int, tuple[int, int | None]] = {}  # pid → (reservation, its start) seen under a reservation
        self.present: set[int] = set()  # the reservations of the last answer
        self.ends: dict[int, float] = {}  # reservation → when it ends unless extended (monotonic): asked again then
        self.installation = installation_key(token)
        self._holds: list[HoldGroups | None] = []

    @property
    def holds(self) -> HoldGroups | None:
        """Where reservations' cgroups go (probed once; None: no usable cgroup, holders' trees are tracked instead)."""
        if not self._holds:
            self._holds.append(hold_groups(self.installation))
        return self._holds[0]

    def _call(self, route: str, body: dict) -> dict:
        try:
            return agent.call(self.transport, f"{self.platform}/api/runner/v1/nodes/{route}", self.token,
                              {"pool": self.pool, "hostname": self.hostname, **body}, pause=self.stopping.wait)
        except Gone as exc:  # a node route's 409 is a refusal of this node, not a stale attempt
            raise Refused(409, str(exc)) from exc

    def register(self, report: dict | None = None) -> dict:
        """Tell the platform what this machine has; it answers with the devices it will hand runs to."""
        report = report if report is not None else probe(self.python)
        answer = self._call("register", {"probe": report, "agent": {
            "version": VERSION, "pid": os.getpid(), "python": self.python, "started": time.time()}})
        self.devices = [int(d["index"]) for d in answer.get("devices", []) if d.get("enabled", True)]
        if answer.get("out_of_service"):
            print(f"node agent: {self.hostname} is out of service: {answer['out_of_service']}", file=sys.stderr)
        return answer

    def due_in(self, longest: float) -> float:
        """How long until the next ask is due: at most `longest`, and no later than the end of a reservation here
        (`ends_in` of the last answer), so its processes end when it does, not at the next heartbeat."""
        if not self.ends:
            return longest
        return max(0.0, min(longest, min(self.ends.values()) - time.monotonic()))

    def free(self) -> list[int]:
        with self.lock:
            return [index for index in self.devices if index not in self.busy]

    def poll(self, wait: float = 0) -> list[dict]:
        """Ask for work for the free devices (this is also the node's heartbeat), waiting up to `wait` seconds for
        some (`nodes/wait`); start each claimed run, then sweep the devices nothing holds."""
        body: dict = {"free": self.free()}
        if time.monotonic() - self.sampled >= SAMPLE_S:  # nvidia-smi at most every SAMPLE_S, sent when new
            self.sampled = time.monotonic()
            if (samples := gpu_samples()) is not None:
                body["samples"] = samples  # the platform's /metrics shows them
        answer, asked = None, time.monotonic()
        if wait:
            try:
                answer = self._call("wait", {**body, "wait": wait})
            except Refused as exc:
                if exc.status != 404 or "register" in str(exc):
                    raise
                self.wait_s = 0  # a platform older than nodes/wait: poll it every --poll seconds
        if answer is None:
            answer = self._call("poll", body)
        self.again = bool(answer.get("again"))
        claims = answer.get("claims", [])
        for claim in claims:
            self.start(claim)
        reserved = answer.get("reserved", [])
        if self.spares is not None:
            self.spares.reserve([str(i) for i in reserved])
        # from when it asked: a held wait's answer may be as old (early is harmless: the end is asked about again)
        self.ends = {int(r["id"]): asked + END_MARGIN_S + float(r["ends_in"]) for r in answer.get("reservations") or []
                     if isinstance(r.get("ends_in"), int | float)}
        self.sweep(reserved, answer.get("reservations"))
        if self.authorized_keys is not None:
            active = {int(r["id"]) for r in answer.get("reservations") or []}
            groups = {rid: path for rid in active if self.holds and (path := self.holds.ensure(rid))}
            place_keys(self.authorized_keys, key_lines(answer.get("keys", []), self.installation, groups))
        return claims

    def sweep(self, reserved: list[int], reservations: list[dict] | None = None) -> list[int]:
        """The pool's devices belong to the platform, at most every `sweep_s`: a process left on one that neither a
        run of this agent nor a reservation holds is killed; so is every process a reservation owns once that
        reservation is no longer here (`reservations`: those holding devices now, `{"id", "gpus"}`), even when the
        next one holds the same devices. A reservation owns the processes carrying its RESERVATION_ENV (its holders'
        SSH logins and all they start) and those first seen on its devices while it held them. Returns the pids
        killed. Device processes need nvidia-smi; tagged ones are found in /proc."""
        now = time.monotonic()
        active = {int(r["id"]): [int(i) for i in r["gpus"]] for r in reservations or []}
        ended = reservations is not None and bool(self.present - set(active))  # swept at once, never skipped
        if reservations is not None:
            self.present = set(active)
        if now - self.swept < self.sweep_s and not ended:
            return []
        self.swept = now
        on_devices = compute_processes() or {}
        holder_of = {index: rid for rid, gpus in active.items() for index in gpus}
        if reservations is not None:
            for pid, rid in tagged_processes(self.installation).items():
                if not descends_from(pid, os.getpid()):  # never this agent, even started from a holder's login
                    self.owned.setdefault(pid, (rid, process_start(pid)))
        with self.lock:
            idle = [i for i in self.devices if i not in self.busy and i not in reserved]
        killed = []
        for index, pids in on_devices.items():
            for pid in pids:
                if pid in self.owned or descends_from(pid, os.getpid()):
                    continue  # owned: decided below; a spare of this agent's holds no context, but never kill it
                if index in holder_of:
                    self.owned[pid] = (holder_of[index], process_start(pid))
                elif index in idle and self.kill(pid):
                    killed.append(pid)
                    print(f"node agent: killed pid {pid}, left on device {index}, which nothing holds",
                          file=sys.stderr)
        gone: dict[int, list[int]] = {}
        for pid, (rid, start) in list(self.owned.items()):
            if process_start(pid) != start:
                del self.owned[pid]  # gone (its pid may be another process's now)
            elif reservations is not None and rid not in active:
                del self.owned[pid]
                gone.setdefault(rid, []).append(pid)
        for rid, pids in gone.items():
            for pid in self.kill_tree(pids):
                killed.append(pid)
                print(f"node agent: killed pid {pid} of reservation {rid}, which ended", file=sys.stderr)
        if reservations is not None and self.holds is not None:
            for rid, pids in self.holds.end(set(active)).items():
                killed += pids
                for pid in pids:
                    print(f"node agent: killed pid {pid} of reservation {rid}, which ended (its cgroup)",
                          file=sys.stderr)
        return killed

    def kill_tree(self, roots: list[int]) -> list[int]:
        """Stop `roots` and their descendants until no new one appears (nothing forks while stopped), then kill them."""
        stopped: list[int] = []
        while fresh := [p for p in process_tree(roots) if p not in stopped and not descends_from(p, os.getpid())]:
            for pid in fresh:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGSTOP)
            stopped += fresh
            roots = stopped
        return [pid for pid in stopped if self.kill(pid)]

    @staticmethod
    def kill(pid: int) -> bool:
        try:
            os.kill(pid, signal.SIGKILL)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def sweep_leftovers(self) -> None:
        """What an agent killed outright left behind, swept when one starts: run directories no live process uses
        (competitors' code) and reservations' SSH key lines (the first poll places those of reservations active now)."""
        for path in stale_run_dirs(self.workroot):
            shutil.rmtree(path, ignore_errors=True)
            print(f"node agent: removed {path}, left by a run no process runs", file=sys.stderr)
        if self.authorized_keys is not None:
            place_keys(self.authorized_keys, [])

    def start(self, claim: dict, *, wait: bool = False) -> None:
        indices = [int(i) for i in claim["devices"]]
        with self.lock:
            for index in indices:
                self.busy[index] = (claim["run"], claim["attempt"])
        if wait:
            self.execute(claim, indices)
            return
        thread = threading.Thread(target=self.execute, args=(claim, indices), daemon=True,
                                  name=f"run-{claim['run']}-{claim['attempt']}")
        self.threads = [t for t in self.threads if t.is_alive()] + [thread]
        thread.start()

    def execute(self, claim: dict, indices: list[int]) -> None:
        run_id, number = int(claim["run"]), int(claim["attempt"])
        platform = Platform(self.platform, run_id, number, claim["token"], self.transport)
        try:
            try:
                result = run_attempt(platform, self.workroot, gpus=[str(i) for i in claim.get("gpus", [])],
                                     job_extra=claim.get("job", {}), python=self.python,
                                     heartbeat_s=float(claim.get("heartbeat_s", agent.HEARTBEAT_S)), warm=self.warm,
                                     spares=self.spares)
            finally:
                self.release(indices)  # before reporting: the platform's wake-up then finds the devices free
            platform.call("result", result)
        except Gone as exc:
            print(f"run {run_id} attempt {number} is no longer ours: {exc}", file=sys.stderr)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            print(f"run {run_id} attempt {number}: infrastructure failure: {reason}", file=sys.stderr)
            try:
                platform.call("failure", {"reason": f"node {self.hostname}: {reason}"[:2000]}, retries=3)
            except Exception as report_exc:
                print(f"could not report the failure: {report_exc}", file=sys.stderr)
        finally:
            self.release(indices)

    def release(self, indices: list[int]) -> None:
        with self.lock:
            for index in indices:
                self.busy.pop(index, None)

    def drain(self) -> int:
        """Take and run, one after the other in this thread, every run the platform has for this node now; how many
        (tests and one-shot use)."""
        done = 0
        while claims := self._call("poll", {"free": self.free()}).get("claims", []):
            for claim in claims:
                self.start(claim, wait=True)
                done += 1
        return done

    def serve(self) -> None:
        """Register, then ask for work (also the node's heartbeat) every poll interval, until stopped. Anything the
        platform refuses or cannot answer is retried: it may be starting, or refuse this node until an organiser
        acts; a platform that forgot the node (404: deleted in the admin) gets a new registration."""
        registered = False
        self.sweep_leftovers()
        while not self.stopping.is_set():
            try:
                if not registered:
                    self.register()
                    registered = True
                    print(f"node agent: {self.hostname} in pool {self.pool}: devices {self.devices}", file=sys.stderr)
                started = time.monotonic()
                wait = max(self.due_in(self.wait_s), END_MARGIN_S) if self.wait_s else 0
                self.poll(wait)
                held = time.monotonic() - started > (min(self.poll_s, wait) if wait else self.poll_s)
                if self.again or held or not self.due_in(self.poll_s):
                    continue  # a held wait: its answer is news, its heartbeat or a reservation's end is due
            except Refused as exc:
                registered = registered and exc.status != 404
                print(f"node agent: refused: {exc}", file=sys.stderr)
                self.stopping.wait(2 if exc.status == 404 else 10)
            except Exception as exc:
                print(f"node agent: {'poll' if registered else 'registration'} failed ({exc}); retrying",
                      file=sys.stderr)
                self.stopping.wait(2)
            self.stopping.wait(self.due_in(self.poll_s))
        if self.spares is not None:
            self.spares.close()
        if self.authorized_keys is not None:
            place_keys(self.authorized_keys, [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runners.harness.node", description=__doc__.split("\n\n")[0])
    parser.add_argument("--platform", required=True, help="the platform's URL, e.g. https://kernelbot.example.org")
    parser.add_argument("--pool", required=True, help="the GPU pool (backend local) this machine belongs to")
    parser.add_argument("--hostname", default=socket.gethostname(), help="this machine's name in the pool")
    parser.add_argument("--python", default=os.environ.get("KERNELBOT_HARNESS_PYTHON") or sys.executable,
                        help="the interpreter that runs the harness (with torch)")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()), help="where runs unpack")
    parser.add_argument("--wait", type=float, default=WAIT_S,
                        help="the longest the platform holds an ask for work open (the node's heartbeat)")
    parser.add_argument("--poll", type=float, default=POLL_S,
                        help="seconds between asks for work where the platform answers at once")
    parser.add_argument("--cold", action="store_true",
                        help="start every run's harness in a new interpreter (no warm template, no spares)")
    parser.add_argument("--no-spares", action="store_true",
                        help="start no harness ahead of its run (a spare holds a sandboxed interpreter per device)")
    parser.add_argument("--authorized-keys", type=Path, default=None,
                        help="keep the SSH keys of reservations active here in this file (e.g. "
                             "~/.ssh/authorized_keys): holders then log in as this agent's account, so only on a "
                             "machine that runs no competition (docs/operations.md)")
    args = parser.parse_args(argv)
    key = os.environ.pop(KEY_ENV, "")  # not passed on to anything this agent starts
    token = os.environ.pop(NODE_TOKEN_ENV, "").strip() or (node_token(key, args.pool, args.hostname) if key else "")
    if not token:
        command = shlex.join(["manage.py", "node_token", args.pool, "--hostname", args.hostname])
        print(f"{NODE_TOKEN_ENV} is not set (`{command}`, run where the platform runs, prints it)", file=sys.stderr)
        return 2
    agent.harden_self()
    args.workdir.mkdir(parents=True, exist_ok=True)
    node = NodeAgent(args.platform, args.pool, args.hostname, token, python=args.python, workroot=args.workdir,
                     poll_s=args.poll, wait_s=args.wait, warm=not args.cold, spares=not (args.cold or args.no_spares))
    node.authorized_keys = args.authorized_keys.expanduser() if args.authorized_keys else None
    signal.signal(signal.SIGTERM, lambda *_: node.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: node.stopping.set())
    node.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
