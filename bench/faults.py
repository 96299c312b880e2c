"""Issue 35's combined fault round on the production layout: one bad part never takes down more than itself.

    python bench/faults.py [--seconds 120] [--node-b dead|misconfigured] [--interval 2.5] [--keep]

Brings up what docs/operations.md runs, each service from its `deploy/systemd/*.service` `ExecStart` line (paths and
port substituted): granian with 2 workers and `--respawn-failed-workers`, `manage.py workers`, and two node agents
of one CPU pool (`lab`), each with its node's token (`manage.py node_token`), never the runner key; PostgreSQL
database `kb35_faults` (dropped and created), and a redis-server of its own on a spare port (`--redis-port`, 6391;
the shared Redis is never touched). Each agent runs in a PID namespace of its own (`unshare --pid`), as if on a
machine of its own: an agent sweeps its machine's processes (reservation ownership), so two on one machine would
sweep each other's.

Then, for `--seconds`, a steady stream of submissions through the JSON APIs the CLIs use (kernelbot's `POST
/api/v1/submissions` with a user's API token, and popcorn-cli's `POST /popcorn/submission/...` with its cli id), one
every `--interval` s, round-robin over 4 users, every 8th ranked (leaderboard mode, two runs), the others test mode;
beside it two clients probing pages and API reads (home, the board page, /api/v1/leaderboards, /api/v1/me,
/api/v1/health/runners, the user's submissions), every request on a new connection. Meanwhile:

- node B is dead: `--node-b dead` SIGKILLs its agent (its whole namespace) as soon as it runs a run, early in the
  load, and it never comes back; `--node-b misconfigured` starts it under KERNELBOT_SANDBOX=require with no usable
  memory cgroup (it registers, stays live, and must never take a run);
- a pool health-check round is started once node B is out (and again later), as the schedule does;
- Redis is SIGSTOPped for 20 s, then SIGCONTed;
- one granian worker (not the master) is SIGKILLed during the Redis stop and another after it.

Counted: the answers by status class (5xx must be 0), connections refused or reset (must be 0; a request the killed
worker had already taken, sent before the kill and unanswered after it, dies with the process: counted apart),
submissions accepted vs refused (a 503 for CPU, the live node's type, must be 0). After the load, every run is
waited for: each submission answered 201/accepted must exist once with all its runs in exactly one terminal state,
one attempt ending it and the others retried (0 lost, 0 doubled), no submission stored that no answer reported, and
every board's ranks and records equal a rebuild from its runs (`leaderboards.ranks.do_recompute_ranks`, rolled
back).

Last, the reservation phase on a second pool (`lend`, one node whose agent keeps holders' SSH keys with
`--authorized-keys`, and a stand-in nvidia-smi listing the processes "on" its device): holder 1 reserves it through
the API and starts 4 processes through the agent's forced ssh command (one on the device, one beside it, one
detached into a session of its own, and one that drops the reservation's environment but runs on the device);
holder 2 reserves the same device (queued behind); holder 1 ends theirs through the API, so holder 2's starts at
once on the same device. Counted: holder 1's processes still alive 10 s later (must be 0), holder 2's login alive.
"""

from __future__ import annotations

import argparse
import configparser
import contextlib
import errno
import json
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
UNITS = REPO / "deploy" / "systemd"
PG = os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
DB = "kb35_faults"
CORRECT = (REPO / "problems/demo/vectoradd_py/solutions/correct.py").read_bytes()
USERS = 4
FAKE_NVIDIA_SMI = """#!/bin/sh
# nvidia-smi at its edge: one GPU (index 0) and the compute processes listed (one pid a line) in the file beside it
case "$1" in
  --query-gpu=*) echo "0, 00000000:3B:00.0" ;;
  --query-compute-apps=*) while read -r pid; do echo "$pid, 00000000:3B:00.0"; done < "$(dirname "$0")/pids" ;;
esac
"""


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def exec_start(unit: str, env: dict[str, str], port: int, runs: str) -> list[str]:
    """The unit's ExecStart line, as tests/test_production_install.py substitutes it."""
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read(UNITS / unit)
    line = parser["Service"]["ExecStart"].replace("/srv/kernelbot/.venv/bin/python", sys.executable)
    line = line.replace("--port 8000", f"--port {port}").replace("/var/lib/kernelbot/runs", runs)
    line = re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], line).replace("%H", socket.gethostname())
    return shlex.split(line)


def children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found.update(int(child) for child in (task / "children").read_text().split())
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Layout:
    """The services, their logs under `self.dir`, and the environment they share."""

    def __init__(self, args):
        self.args = args
        self.dir = Path(tempfile.mkdtemp(prefix="kb35-faults-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.redis_port = args.redis_port
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("DJANGO_", "KERNELBOT_", "DEBUG", "PYTEST", "REDIS_", "DATABASE_"))} | {
            "SECRET_KEY": "faults-bench-" + "x" * 50, "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "SECURE_SSL_REDIRECT": "0", "SECURE_COOKIES": "0", "SECURE_HSTS_SECONDS": "0",
            "DATABASE_URL": f"{PG}/{DB}", "REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0", "DB_POOL": "1",
            "KERNELBOT_PUBLIC_URL": self.url, "KERNELBOT_RUNNER_KEY": uuid.uuid4().hex,
            "KERNELBOT_INSTANCE": f"kb35-faults-{os.getpid()}", "KERNELBOT_DATA_DIR": str(self.dir / "data"),
            "KERNELBOT_SANDBOX": "require", "KERNELBOT_CASE_BUDGET_S": "0.5", "KERNELBOT_POOL_CHECK_INTERVAL": "0",
            "KERNELBOT_SPREAD_REFRESH_DAYS": "0",
            "KERNELBOT_QUOTA_TEST": "0", "KERNELBOT_QUOTA_RANKED": "0", "LOG_LEVEL": "WARNING",
            "DJANGO_SETTINGS_MODULE": "kernelbot.settings"}
        self.redis: subprocess.Popen | None = None
        self.services: dict[str, subprocess.Popen] = {}

    def manage(self, *args: str) -> str:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=self.env, capture_output=True,
                              text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)}: {done.stdout[-2000:]}{done.stderr[-3000:]}")
        return done.stdout

    def start_redis(self) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.redis = subprocess.Popen([binary, "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "",
                                       "--appendonly", "no", "--dir", str(self.dir)],
                                      stdout=(self.dir / "redis.log").open("w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.redis_port), 0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
            if self.redis.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on {self.redis_port} did not start: {self.dir / 'redis.log'}")
            time.sleep(0.1)

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        process = subprocess.Popen(argv, cwd=REPO, env=env or self.env, start_new_session=True,
                                   stdout=(self.dir / f"{name}.log").open("w"), stderr=subprocess.STDOUT)
        self.services[name] = process
        return process

    def start_agent(self, name: str, pool: str, hostname: str, *, env: dict[str, str] | None = None,
                    args: tuple[str, ...] = ()) -> subprocess.Popen:
        """The agent unit's ExecStart with `--hostname` (another machine's name), in a PID namespace of its own whose
        init is a shell (a holder's orphaned processes are adopted by it, not by the agent, as on a real machine)."""
        runs = self.dir / f"runs-{hostname}"
        runs.mkdir(exist_ok=True)
        token = self.manage("node_token", pool, "--hostname", hostname).strip()
        agent_env = {k: v for k, v in self.env.items() if k != "KERNELBOT_RUNNER_KEY"} | {
            "KERNELBOT_NODE_TOKEN": token, "KERNELBOT_AGENT_POOL": pool, **(env or {})}
        argv = exec_start("kernelbot-agent.service", agent_env, self.port, str(runs)) + [
            "--hostname", hostname, *args]
        return self.start(name, ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", '"$@" & wait $!', "sh",
                                 *argv], agent_env)

    def namespace_init(self, name: str) -> int:
        """The outer pid of the shell that is pid 1 in the agent's namespace."""
        deadline = time.monotonic() + 10
        while not (found := children(self.services[name].pid)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: no namespace init")
            time.sleep(0.05)
        return min(found)

    def kill(self, name: str) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.services[name].pid, signal.SIGKILL)
        self.services[name].wait()

    def log(self, name: str) -> str:
        return (self.dir / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        for process in self.services.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for process in self.services.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        if self.redis is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.redis.pid, signal.SIGCONT)
            self.redis.kill()
            self.redis.wait()


class Tally:
    """What every request got: status or transport failure, per kind; thread-safe."""

    def __init__(self):
        self.lock = threading.Lock()
        self.codes: Counter = Counter()  # (kind, "2xx"/"4xx"/"5xx"/"refused"/"reset"/"timeout"/"other")
        self.bad: list[str] = []
        self.latency: list[tuple[float, float]] = []  # (start, seconds)
        self.accepted: dict[int, str] = {}  # submission id → mode
        self.accepted_at: list[float] = []  # seconds into the load
        self.failures: list[tuple[float, float, str]] = []  # (start, end, class) of each request that got no answer
        self.refused_503 = 0
        self.not_accepted: list[str] = []

    def record(self, kind: str, what: str, started: float, detail: str = "") -> None:
        with self.lock:
            self.codes[(kind, what)] += 1
            self.latency.append((started, time.monotonic() - started))
            if not what[0].isdigit():
                self.failures.append((started - T0, time.monotonic() - T0, what))
            if what not in ("2xx",) and len(self.bad) < 40:
                self.bad.append(f"{started - T0:6.1f}-{time.monotonic() - T0:.1f}s {kind} {what} {detail}"[:300])


T0 = time.monotonic()


def classify(exc: Exception) -> str:
    text = repr(exc)
    seen = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.ECONNREFUSED:
            return "refused"
        if isinstance(seen, OSError) and seen.errno in (errno.ECONNRESET, errno.EPIPE):
            return "reset"
        seen = seen.__cause__ or seen.__context__
    if isinstance(exc, httpx.ConnectError) and "refused" in text.lower():
        return "refused"
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        return "reset"
    return "other"


def request(tally: Tally, kind: str, method: str, url: str, **kw) -> httpx.Response | None:
    started = time.monotonic()
    try:
        with httpx.Client(timeout=60, limits=httpx.Limits(max_keepalive_connections=0)) as client:
            response = client.request(method, url, **kw)
    except httpx.HTTPError as exc:
        tally.record(kind, classify(exc), started, repr(exc))
        return None
    tally.record(kind, f"{response.status_code // 100}xx", started,
                 f"{response.status_code} {response.text[:200]!r}" if response.status_code >= 400 else "")
    return response


def submitter(layout: Layout, tally: Tally, tokens: list[str], stop: threading.Event, interval: float) -> None:
    n = 0
    while not stop.is_set():
        started = time.monotonic()
        token, mode = tokens[n % len(tokens)], "leaderboard" if n % 8 == 7 else "test"
        code = CORRECT + f"\n# submission {n}\n".encode()
        if n % 2 == 0:  # kernelbot CLI
            r = request(tally, "submit", "POST", f"{layout.url}/api/v1/submissions",
                        headers={"Authorization": f"Bearer {token}"},
                        files={"file": ("correct.py", code)}, data={"leaderboard": "vectoradd", "gpu": "CPU",
                                                                     "mode": mode})
            sid = r.json().get("id") if r is not None and r.status_code == 201 else None
        else:  # popcorn-cli
            r = request(tally, "submit", "POST", f"{layout.url}/popcorn/submission/vectoradd/CPU/{mode}",
                        headers={"X-Popcorn-Cli-Id": token}, files={"file": ("correct.py", code)})
            ok = r is not None and r.status_code == 200 and r.json().get("status") == "accepted"
            sid = r.json()["details"]["id"] if ok else None
        if sid is not None:
            with tally.lock:
                tally.accepted[int(sid)] = mode
                tally.accepted_at.append(started - T0)
        elif r is not None:
            with tally.lock:
                tally.refused_503 += r.status_code == 503
                tally.not_accepted.append(f"{r.status_code} {r.text[:200]}")
        n += 1
        stop.wait(max(0.0, interval - (time.monotonic() - started)))


def prober(layout: Layout, tally: Tally, token: str, stop: threading.Event, k: int, availability: list) -> None:
    paths = ["/", "/lb/vectoradd/", "/api/v1/leaderboards", "/api/v1/me", "/api/v1/health/runners",
             "/api/v1/submissions?limit=5", "/api/v1/leaderboards/vectoradd/rankings/CPU"]
    n = k
    while not stop.is_set():
        path = paths[n % len(paths)]
        r = request(tally, "probe", "GET", layout.url + path, headers={"Authorization": f"Bearer {token}"})
        if r is not None and path == "/api/v1/health/runners" and r.status_code == 200:
            with tally.lock:  # (seconds, why CPU takes no runs or None, nodes out of service: staff see them)
                answer = r.json()
                availability.append((time.monotonic() - T0, answer["gpu_types"].get("CPU"),
                                     answer.get("nodes_out_of_service")))
        n += 1
        stop.wait(0.25)


def django_setup(env: dict[str, str]) -> None:
    os.environ.update(env)
    sys.path.insert(0, str(REPO))
    import django

    django.setup()


def seed(layout: Layout) -> list[str]:
    """Users with API tokens (also their popcorn cli ids), two with SSH keys; the lend pool's reservation policy."""
    from django.contrib.auth import get_user_model

    from leaderboards.access.actions import do_create_token
    from runners.models import GpuPool
    from runners.reservations import keys
    from runners.reservations.models import PoolPolicy

    tokens = []
    for i in range(USERS + 2):
        user = get_user_model().objects.create(username=f"faults{i}", is_staff=i == 1)  # staff: nodes' health
        tokens.append(do_create_token(user)[1])
        if i >= USERS:  # the reservation holders
            key = layout.dir / f"key{i}"
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
            keys.do_add_key(user, (layout.dir / f"key{i}.pub").read_text())
    PoolPolicy.objects.create(pool=GpuPool.objects.get(name="lend"), competition_share=0)
    return tokens


def wait_for(predicate, timeout: float, what: str, step: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(step)


def node_holds_run(hostname: str) -> bool:
    from runners.reservations.models import DeviceHold, HoldKind

    return DeviceHold.objects.filter(node__hostname=hostname, kind=HoldKind.RUN, ended__isnull=True).exists()


def start_check_round() -> str:
    from leaderboards.health import do_start_pool_check
    from runners.models import GpuPool

    checks = do_start_pool_check(GpuPool.objects.get(name="lab"))
    return ", ".join(f"{c.node.hostname if getattr(c, 'node', None) else 'pool'}" for c in checks) or "none new"


def verify(tally: Tally, start) -> dict:
    """Every accepted submission once, each run terminal once; boards equal a rebuild."""
    from django.db import transaction

    from leaderboards.health import CHECK_BOARD
    from leaderboards.models import TERMINAL_STATUSES, Board, BoardEntry, Record, Run, RunAttempt, Submission
    from leaderboards.ranks import do_recompute_ranks
    from runners.reservations.models import DeviceHold, HoldKind

    subs = Submission.objects.exclude(leaderboard__name=CHECK_BOARD)
    stored = set(subs.values_list("pk", flat=True))
    accepted = set(tally.accepted)
    runs = list(Run.objects.filter(submission__in=stored))
    statuses = Counter(run.status for run in runs)
    not_terminal = [run.pk for run in runs if run.status not in TERMINAL_STATUSES]
    doubled = []
    attempts = Counter()
    for run in runs:
        ends = list(RunAttempt.objects.filter(run=run).order_by("number").values_list("outcome", flat=True))
        attempts[len(ends)] += 1
        final = [o for o in ends if o and o != "retried"]
        if len(final) != 1 or final[0] != run.status or ends[-1] != run.status:
            doubled.append((run.pk, run.status, ends))
    node_of = {(run_id, number): host for run_id, number, host in DeviceHold.objects.filter(
        kind=HoldKind.RUN, run_id__in=[r.pk for r in runs]).values_list("run_id", "run_attempt", "node__hostname")}
    expected_runs = sum(2 if mode == "leaderboard" else 1 for mode in tally.accepted.values())
    checks = Run.objects.filter(submission__leaderboard__name=CHECK_BOARD)
    boards_equal, boards = True, 0
    for board in Board.objects.select_related("leaderboard"):
        def state(b=board):
            return (sorted(BoardEntry.objects.filter(leaderboard=b.leaderboard, gpu_type=b.gpu_type).values_list(
                "user_id", "submission_id", "tied", "score", "rank_key", "ratio", "submitted_at")),
                    sorted(Record.objects.filter(leaderboard=b.leaderboard, gpu_type=b.gpu_type).values_list(
                        "submission_id", "user_id", "score", "submitted_at", "board_best")))
        before = state()
        with transaction.atomic():
            do_recompute_ranks(board.leaderboard_id, board.gpu_type_id)
            after = state()
            transaction.set_rollback(True)
        boards += 1
        if before != after:
            boards_equal = False
            print(f"board {board.leaderboard.name}/{board.gpu_type}: incremental {before} != rebuild {after}")
    return {
        "accepted": len(accepted), "stored": len(stored), "lost_submissions": len(accepted - stored),
        "unanswered_stored": len(stored - accepted), "runs": len(runs), "expected_runs": expected_runs,
        "not_terminal": len(not_terminal), "doubled": len(doubled), "doubled_detail": doubled[:5],
        "statuses": dict(statuses), "attempts": dict(attempts),
        "runs_on": dict(Counter(node_of.values())),
        "retried": [f"run {a.run_id} attempt {a.number} on {node_of.get((a.run_id, a.number), '?')}, "
                    f"{(a.dispatched_at - start).total_seconds():.0f}-{(a.finished_at - start).total_seconds():.0f} s"
                    f": {a.reason}" for a in RunAttempt.objects.filter(run__in=runs, outcome="retried")],
        "checks": dict(Counter(checks.values_list("status", flat=True))),
        "check_nodes": dict(Counter(f"{n}:{s}" for n, s in checks.values_list("node__hostname", "status"))),
        "boards": boards, "boards_equal_rebuild": boards_equal}


def all_terminal(accepted: set[int]) -> bool:
    from leaderboards.models import ACTIVE_STATUSES, Run

    return not Run.objects.filter(submission__in=accepted, status__in=ACTIVE_STATUSES).exists() and \
        Run.objects.filter(submission__in=accepted).count() > 0


# --- the reservation phase ------------------------------------------------------------------------------------------

def ns_pids(init: int) -> dict[int, int]:
    """inner pid → outer pid of every process in the PID namespace whose init is `init` (outer pid)."""
    target = os.readlink(f"/proc/{init}/ns/pid")
    found = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if os.readlink(entry / "ns/pid") != target:
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("NSpid:"):
                    found[int(line.split()[-1])] = int(entry.name)
        except OSError:
            continue
    return found


def tagged(init: int, rid: int) -> set[int]:
    """Outer pids, in the namespace, whose environment carries KERNELBOT_RESERVATION=rid."""
    mark = f"KERNELBOT_RESERVATION={rid}".encode()
    out = set()
    for outer in ns_pids(init).values():
        with contextlib.suppress(OSError):
            if mark in (Path(f"/proc/{outer}/environ").read_bytes().split(b"\0")) and alive(outer):
                out.add(outer)
    return out


def login(init: int, line: str, command: str) -> int:
    """What sshd does with a holder's authorized_keys line: its forced command with SSH_ORIGINAL_COMMAND, here inside
    the node's namespace, detached; the inner pid of the login (bash execs the command)."""
    forced = line.split('command="', 1)[1].split('" ssh-', 1)[0].replace('\\"', '"')
    done = subprocess.run(["nsenter", "-t", str(init), "-p", "-m", "--", "sh", "-c",
                           'bash -c "$FORCED" >/dev/null 2>&1 & echo $!'], capture_output=True, text=True,
                          check=True, env={**os.environ, "FORCED": forced, "SSH_ORIGINAL_COMMAND": command})
    return int(done.stdout)


def inner_of(init: int, needle: bytes) -> int | None:
    """The inner pid of the live process in the namespace whose command line contains `needle`."""
    for inner, outer in ns_pids(init).items():
        with contextlib.suppress(OSError):
            if needle in Path(f"/proc/{outer}/cmdline").read_bytes() and alive(outer):
                return inner
    return None


def reservation_phase(layout: Layout, tokens: list[str], tries: int = 3) -> dict:
    """Successions on the lend node until one is not disturbed from outside: an agent of someone else's on this machine
    (a test's, in the root PID namespace, which sees every process) kills every process tagged with a reservation
    that is not its own. Each process of holder 1 must be alive just before the end and, if dead after it, named in
    this node's agent's log as killed by it; holder 2's login must not have been killed by anything else."""
    smi_dir = layout.dir / "smi"
    smi_dir.mkdir()
    (smi_dir / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (smi_dir / "nvidia-smi").chmod(0o755)
    (smi_dir / "pids").write_text("")
    keys_file = layout.dir / "authorized_keys"
    layout.start_agent("agent-lend", "lend", "lendnode", env={"PATH": f"{smi_dir}:{layout.env['PATH']}"},
                       args=("--authorized-keys", str(keys_file), "--poll", "0.2"))
    init = layout.namespace_init("agent-lend")
    wait_for(lambda: "in pool lend: devices [0]" in layout.log("agent-lend"), 120, "the lend agent's registration")
    tally = Tally()
    api = f"{layout.url}/api/v1/gpus/reservations"
    first_token, second_token = tokens[USERS], tokens[USERS + 1]

    def reserve(token: str) -> int:
        r = request(tally, "reserve", "POST", api, headers={"Authorization": f"Bearer {token}"},
                    json={"gpu_type": "CPU", "gpu_count": 1, "minutes": 30, "pool": "lend"})
        assert r is not None and r.status_code == 201, r and r.text
        return r.json()["id"]

    def status(token: str, rid: int) -> str:
        r = request(tally, "reserve", "GET", f"{api}/{rid}", headers={"Authorization": f"Bearer {token}"})
        return r.json()["status"] if r is not None and r.status_code == 200 else "?"

    def cancel(token: str, rid: int) -> None:
        r = request(tally, "reserve", "POST", f"{api}/{rid}/cancel", headers={"Authorization": f"Bearer {token}"})
        assert r is not None and r.status_code == 200, r and r.text

    def key_line(rid: int) -> str:
        return wait_for(lambda: [x for x in keys_file.read_text().splitlines() if x.endswith(f"reservation-{rid}")]
                        if keys_file.exists() else [], 30, f"reservation {rid}'s key line")[0]

    def killed_by_agent(rid: int) -> set[int]:
        return {int(m) for m in re.findall(rf"killed pid (\d+) of reservation {rid}\b", layout.log("agent-lend"))}

    disturbed, outcome = [], {}
    for attempt in range(tries):
        first = reserve(first_token)
        wait_for(lambda rid=first: status(first_token, rid) == "active", 60, "the first reservation to start")
        line1 = key_line(first)
        mark = 600 + 10 * attempt
        procs = {"on the device": login(init, line1, f"sleep {mark}"),
                 "beside it": login(init, line1, f"sleep {mark + 1}")}
        login(init, line1, f"setsid nohup sleep {mark + 2} >/dev/null 2>&1 < /dev/null & exit 0")
        procs["detached (own session)"] = wait_for(lambda m=mark: inner_of(init, f"sleep\0{m + 2}".encode()), 10,
                                                   "the detached process")
        procs["untagged, on the device"] = login(init, line1, f"exec env -u KERNELBOT_RESERVATION sleep {mark + 3}")
        (smi_dir / "pids").write_text(f"{procs['on the device']}\n{procs['untagged, on the device']}\n")
        time.sleep(3)  # sweeps while the reservation holds the device: nothing of it is killed
        second = reserve(second_token)
        waiting = status(second_token, second)
        inner = ns_pids(init)
        before = {name: inner.get(pid) for name, pid in procs.items()}
        alive_before = [name for name, outer in before.items() if outer and alive(outer)]
        cancel(first_token, first)  # holder 1 ends it; holder 2's, waiting for the device, starts at once
        ended_at = time.monotonic()
        wait_for(lambda rid=second: status(second_token, rid) == "active", 60, "the second reservation to start")
        successor_after = time.monotonic() - ended_at
        theirs = login(init, key_line(second), f"sleep {mark + 4}")
        (smi_dir / "pids").write_text("".join(f"{p}\n" for p in (procs["on the device"],
                                                                   procs["untagged, on the device"], theirs)))
        time.sleep(10)  # five sweeps
        survivors = [name for name, outer in before.items() if outer and alive(outer)]
        survivors += [f"tagged pid {p}" for p in tagged(init, first)
                      if p not in before.values()]  # anything else of its
        by_agent = killed_by_agent(first)
        by_others = [name for name, pid in procs.items() if name not in survivors and pid not in by_agent]
        theirs_outer = ns_pids(init).get(theirs)
        holder2_alive = bool(theirs_outer and alive(theirs_outer))
        outcome = {"holder1_processes": len(procs), "alive_before_end": len(alive_before),
                   "successor_waiting_before": waiting, "successor_active_after_s": round(successor_after, 2),
                   "survivors": len(survivors), "survivor_names": survivors,
                   "killed_by_the_agent": len(by_agent & set(procs.values())), "holder2_alive": holder2_alive,
                   "holder2_killed_by_the_agent": theirs in killed_by_agent(second)}
        outside = len(alive_before) < len(procs) or by_others or (not holder2_alive and
                                                                  not outcome["holder2_killed_by_the_agent"])
        cancel(second_token, second)  # the device is free for the next try, holder 2's processes end
        if not outside:
            break
        disturbed.append(f"try {attempt + 1}: killed from outside the node's agent: "
                         f"{sorted({*(n for n in procs if n not in alive_before), *by_others})} (holder 2 alive: "
                         f"{holder2_alive})")
        say(f"reservation phase {disturbed[-1]}; again")
        time.sleep(3)
    outcome["disturbed_tries"] = disturbed
    outcome["http"] = {f"{kind} {what}": n for (kind, what), n in tally.codes.items()}
    return outcome


# --- the round ------------------------------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=120, help="how long submissions are sent")
    parser.add_argument("--interval", type=float, default=4, help="seconds between submissions")
    parser.add_argument("--node-b", choices=["dead", "misconfigured"], default="dead")
    parser.add_argument("--redis-port", type=int, default=6391)
    parser.add_argument("--redis-stop", type=float, default=20, help="seconds Redis stays SIGSTOPped")
    parser.add_argument("--no-reservations", action="store_true", help="skip the reservation phase")
    parser.add_argument("--keep", action="store_true", help="keep the logs' directory and the database")
    args = parser.parse_args()
    global T0
    layout = Layout(args)
    say(f"logs in {layout.dir}")
    subprocess.run(["psql", f"{PG}/postgres", "-qc", f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)"], check=True,
                   capture_output=True)
    subprocess.run(["psql", f"{PG}/postgres", "-qc", f"CREATE DATABASE {DB}"], check=True, capture_output=True)
    ok = False
    try:
        layout.start_redis()
        layout.manage("migrate")
        layout.manage("add_pool", "lab", "--gpu-type", "CPU")
        layout.manage("add_pool", "lend", "--gpu-type", "CPU")
        layout.manage("import_problems", str(REPO / "problems/demo/vectoradd_py"), "--leaderboard", "vectoradd",
                      "--gpu", "CPU")
        django_setup(layout.env)
        tokens = seed(layout)
        layout.start("web", exec_start("kernelbot-web.service", layout.env, layout.port, ""))
        layout.start("workers", exec_start("kernelbot-workers.service", layout.env, layout.port, ""))
        wait_for(lambda: request(Tally(), "x", "GET", f"{layout.url}/api/v1/health") is not None, 60, "the web")
        layout.start_agent("agent-a", "lab", "nodea")
        b_env = {"KERNELBOT_CGROUP": "/sys/fs/cgroup/memory/kb35-faults-missing"} \
            if args.node_b == "misconfigured" else {}
        layout.start_agent("agent-b", "lab", "nodeb", env=b_env)
        wait_for(lambda: "in pool lab: devices" in layout.log("agent-a") and
                 "in pool lab: devices" in layout.log("agent-b"), 180, "both agents' registrations")
        say("both agents registered; " + ("node B cannot contain memory" if args.node_b == "misconfigured" else
                                          "node B is killed once it runs a run"))

        tally, stop, availability = Tally(), threading.Event(), []
        T0 = time.monotonic()
        load_started = datetime.now(UTC)
        threads = [threading.Thread(target=submitter, args=(layout, tally, tokens[:USERS], stop, args.interval)),
                   *(threading.Thread(target=prober, args=(layout, tally, tokens[k], stop, k, availability))
                     for k in range(2))]
        for t in threads:
            t.start()
        events = []

        def at(when: float) -> None:
            time.sleep(max(0.0, when - (time.monotonic() - T0)))

        def event(what: str) -> None:
            events.append(f"{time.monotonic() - T0:6.1f}s {what}")
            say(what)

        if args.node_b == "dead":
            with contextlib.suppress(RuntimeError):
                wait_for(lambda: node_holds_run("nodeb"), 25, "node B to hold a run", 0.2)
            layout.kill("agent-b")
            event("node B's agent SIGKILLed (its namespace with it)" + (" while it held a run"
                                                                      if node_holds_run("nodeb") else ""))
        b_out = time.monotonic() - T0 + (12 if args.node_b == "dead" else 1)
        at(b_out)
        event(f"health-check round started: checks for {start_check_round()}")
        redis_at = max(b_out + 8, 0.3 * args.seconds)
        at(redis_at)
        os.kill(layout.redis.pid, signal.SIGSTOP)
        stopped_at = time.monotonic() - T0
        event("Redis SIGSTOPped")
        at(redis_at + args.redis_stop / 2)
        workers = children(layout.services["web"].pid)
        victim = min(workers)
        kills = [time.monotonic() - T0]
        os.kill(victim, signal.SIGKILL)
        event(f"granian worker {victim} SIGKILLed (workers were {sorted(workers)})")
        at(redis_at + args.redis_stop)
        os.kill(layout.redis.pid, signal.SIGCONT)
        resumed_at = time.monotonic() - T0
        event("Redis SIGCONTed")
        at(redis_at + args.redis_stop + 15)
        workers = children(layout.services["web"].pid)
        victim = max(workers)
        kills.append(time.monotonic() - T0)
        os.kill(victim, signal.SIGKILL)
        event(f"granian worker {victim} SIGKILLed (workers were {sorted(workers)})")
        at(max(redis_at + args.redis_stop + 25, 0.85 * args.seconds))
        event(f"health-check round started: checks for {start_check_round()}")
        at(args.seconds)
        stop.set()
        threads[0].join()
        event(f"submissions stopped: {len(tally.accepted)} accepted")
        probing = threading.Event()
        probers = [threading.Thread(target=prober, args=(layout, tally, tokens[k], probing, k, availability))
                   for k in range(2)]
        for t in probers:
            t.start()
        try:
            wait_for(lambda: all_terminal(set(tally.accepted)), 420, "every run to end", 2)
        finally:
            probing.set()
            for t in (*threads, *probers):
                t.join()
        event("every run ended")
        time.sleep(3)  # the last rank tasks
        figures = verify(tally, load_started)
        workers_now = children(layout.services["web"].pid)
        unavailable = [(t, why) for t, why, _ in availability if why is not None]
        out = [nodes for _, _, nodes in availability if nodes]
        reservation = None if args.no_reservations else reservation_phase(layout, tokens)

        lat = [s for _, s in tally.latency]
        # a request the killed worker had taken (sent before the kill, no answer after it) died with the process
        in_flight = [f for f in tally.failures if f[2] == "reset" and any(f[0] <= k <= f[1] for k in kills)]
        during_stop = sum(stopped_at <= t < resumed_at for t in tally.accepted_at)
        codes = tally.codes
        total = sum(codes.values())
        print("\n=== issue 35: combined fault round ===")
        print(f"load: {args.seconds:.0f} s of submissions every {args.interval} s (4 users, 1 in 8 ranked), "
              f"2 probing clients; node B {args.node_b}")
        for line in events:
            print(f"  {line}")
        print("\n| figure | value | target |\n| --- | --- | --- |")
        rows = [
            ("requests", total, ""),
            ("2xx / 3xx / 4xx", f"{sum(v for (k, w), v in codes.items() if w == '2xx')} / "
                                f"{sum(v for (k, w), v in codes.items() if w == '3xx')} / "
                                f"{sum(v for (k, w), v in codes.items() if w == '4xx')}", ""),
            ("5xx", sum(v for (k, w), v in codes.items() if w == "5xx"), "0"),
            ("connections refused", sum(v for (k, w), v in codes.items() if w == "refused"), "0"),
            ("connections reset / dropped", sum(v for (k, w), v in codes.items() if w == "reset"), "0"),
            ("  of which in flight in a worker when it was SIGKILLed", len(in_flight), ""),
            ("timeouts (60 s) / other errors", f"{sum(v for (k, w), v in codes.items() if w == 'timeout')} / "
                                               f"{sum(v for (k, w), v in codes.items() if w == 'other')}", "0 / 0"),
            ("request p50 / p99 / max", f"{statistics.median(lat) * 1000:.0f} ms / "
                                        f"{sorted(lat)[int(0.99 * (len(lat) - 1))] * 1000:.0f} ms / "
                                        f"{max(lat):.2f} s", ""),
            ("submissions accepted / refused 503 / other refusals",
             f"{len(tally.accepted)} / {tally.refused_503} / {len(tally.not_accepted) - tally.refused_503}",
             "all / 0 / 0"),
            ("submissions accepted while Redis was stopped", during_stop, "> 0"),
            ("CPU reported unavailable by /api/v1/health/runners", len(unavailable), "0"),
            ("submissions stored / lost / stored unanswered",
             f"{figures['stored']} / {figures['lost_submissions']} / {figures['unanswered_stored']}", "= / 0 / 0"),
            ("runs / expected", f"{figures['runs']} / {figures['expected_runs']}", "equal"),
            ("runs not ended (lost)", figures["not_terminal"], "0"),
            ("runs not ended exactly once (doubled)", figures["doubled"], "0"),
            ("run statuses", figures["statuses"], ""),
            ("attempts per run", figures["attempts"], ""),
            ("attempts by node", figures["runs_on"], ""),
            ("health-check runs (node:status)", figures["check_nodes"], ""),
            (f"boards equal a rebuild ({figures['boards']})", figures["boards_equal_rebuild"], "True"),
            ("granian workers at the end", len(workers_now), "2"),
        ]
        if reservation:
            rows += [
                ("reservation: holder 1's processes (alive before its end)",
                 f"{reservation['holder1_processes']} ({reservation['alive_before_end']})", "4 (4)"),
                ("reservation: successor's state while holder 1 held the device",
                 reservation["successor_waiting_before"], "pending"),
                ("reservation: successor active after holder 1 ended", f"{reservation['successor_active_after_s']} s",
                 "at once"),
                ("reservation: holder 1's processes alive 10 s after its end", reservation["survivors"], "0"),
                ("reservation: of them killed by the node's agent", reservation["killed_by_the_agent"], "4"),
                ("reservation: successor's login alive", reservation["holder2_alive"], "True"),
            ]
        for name, value, target in rows:
            print(f"| {name} | {value} | {target} |")
        if tally.bad:
            print("\nfirst non-2xx answers / failures:")
            for line in tally.bad[:20]:
                print(f"  {line}")
        if unavailable:
            print("CPU unavailable:", unavailable[:5])
        if out:
            print("nodes out of service, as /api/v1/health/runners last said to staff:", out[-1])
        if tally.not_accepted:
            print("refused submissions:", tally.not_accepted[:5])
        if figures["doubled_detail"]:
            print("runs not ended exactly once:", figures["doubled_detail"])
        for line in figures["retried"]:
            print("retried:", line)
        if reservation:
            print("reservation phase:", json.dumps({k: v for k, v in reservation.items()}, default=str))
        dropped = sum(v for (k, w), v in codes.items() if w == "reset") - len(in_flight)
        met = (not any(w in ("5xx", "refused", "timeout", "other") for (_, w) in codes) and dropped == 0
               and not tally.not_accepted and not unavailable and during_stop > 0 and figures["lost_submissions"] == 0
               and figures["unanswered_stored"] == 0 and figures["runs"] == figures["expected_runs"]
               and figures["not_terminal"] == 0 and figures["doubled"] == 0 and figures["boards_equal_rebuild"]
               and (reservation is None or (reservation["survivors"] == 0 and reservation["holder2_alive"]
                                            and reservation["alive_before_end"] == reservation["holder1_processes"]
                                            and reservation["killed_by_the_agent"] == reservation["holder1_processes"]
                                            )))
        print(f"\nall figures met: {met}")
        ok = met
    finally:
        layout.stop()
        if not args.keep:
            with contextlib.suppress(Exception):
                from django.db import connections
                connections.close_all()
            subprocess.run(["psql", f"{PG}/postgres", "-qc", f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)"],
                           capture_output=True)
            if ok:
                shutil.rmtree(layout.dir, ignore_errors=True)
            else:
                say(f"logs kept in {layout.dir}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
