"""Issues 42 and 50: a fleet of node agents on the production layout; what idle agents cost, how soon a run is claimed,
and the fleet at work (a burst, and a health round beside competitors' runs).

    python bench/fleet.py [--nodes 1000] [--seconds 20] [--runs 20] [--burst 200] [--round-runs 60] [--baseline REF]

For each tree (with `--baseline REF`: that git ref, exported into a temporary directory, first; then this tree),
side by side in one invocation: database `kernelbot_fleet` on $BENCH_PG (dropped, created, migrated by the tree's
own code, the demo loaded), a local pool `fleet` (the demo's own pool disabled) of `--nodes` nodes of 8 CPU devices
each, registered over the wire as agents do (`nodes/register` with a probe report, 50 at a time, before the measured
phases; how long it took is printed and reported as `register_s`; the database then ANALYZEd, again before the work
phase, as autovacuum would have it on a production server: this machine's PostgreSQL runs without), and the web
layout of docs/operations.md: the tree's own deploy/systemd/kernelbot-web.service command (granian, 2 workers, its
flags) for the users' reads and submissions and, where the tree has it, its kernelbot-runners.service (2 workers) for
the agents, as the proxy routes /api/runner/ (the web CPU figures count both), PostgreSQL, Redis (db $BENCH_REDIS_DB,
default 3, under a deployment name of its own), `DB_POOL=1`; scheduled health rounds off
(`KERNELBOT_POOL_CHECK_INTERVAL=0`: phase 5 starts one).

The agents speak the node agent's exact wire protocol (`runners/harness/node.py` of the tree measured), many per
process (`--clients` processes of asyncio + aiohttp): Bearer HMAC(runner key, "node:fleet:HOST"), `free` listing
the node's free devices; a tree whose agent waits (`nodes/wait`, `{"wait": 15}`, asked again at once when the
answer says `again`, else after the poll interval) is driven that way, an older one polls `nodes/poll` every 0.5 s.
Where the tree's agent samples its devices, each ask carries 8 devices' `samples` when the agent would have taken
new ones (every 15 s, as nvidia-smi is run: `node.SAMPLE_S`), varying as a busy GPU's figures do.
Each claimed run is carried out as the agent does (`agent.run_attempt`): its job fetched, one progress post, a passing
result after `--run-seconds` (1; 0: claimed runs keep their devices, never run). Phases, each on the same server:

1. no fleet: `--seconds` of API reads (GET /api/v1/leaderboards and /api/v1/health, one after the other, 20 a
   second): `user_nofleet_p95_ms`;
2. the fleet starts (first asks spread over one heartbeat interval) and settles for `--settle` seconds (default
   two heartbeats: a web process answers a node's ask without the database only once it has seen one full ask of
   it, so the first interval is a fleet's start, not its steady state; its share is `web_cpu_share_settling`);
   then for `--seconds` the idle fleet alone, the web processes' CPU time counted: `web_cpu_share` = CPU seconds
   of granian and its workers / (wall seconds x cores); then for `--seconds` the same reads again (`user_p95_ms`);
3. `--runs` runs submitted and dispatched one every `--gap` s (0.5; 0: a burst) by this bench itself (no workers
   yet): `claim_p50_ms`/`claim_p95_ms` from dispatch committed to the claiming agent's answer,
   `submit_claim_p50_ms`/`submit_claim_p95_ms` from the submission (one clock: this machine's), and
   `dispatch_cpu_ms_mean`/`_p95`, the dispatching process's CPU time per `dispatch_run` with `devices` devices in the
   pool (a worker's cost per dispatch; a tree whose submission dispatches a local pool's run itself has that left
   to this timed call here);
4. the work phase, with the tree's `manage.py workers` (its deploy unit's command) dispatching as in production
   (or, in a tree that does, each submission dispatching its own run): `--burst` submissions one after another
   (200, `burst_submit_s`), `burst_submit_claim_p50_ms`/`_p95_ms` from each submission to its claim, how
   they ended (`burst_runs`) and the CPU seconds each part spent until they had (`burst_cpu_s`: web, workers, the
   emulated agents, this bench's driver, PostgreSQL; all on the same cores);
5. a health round forced on the pool (what the admin's "Check health now" does) while the API is read as in phase 1
   and `--round-runs` competitors' runs are submitted one every `--round-gap` s: `round_s` until no check of the
   pool is pending, `round_user_p95_ms` (and `round_user_p95_vs_idle`, against phase 2's), `round_web_cpu_share`,
   the nodes by service afterwards (`out_of_service_after`), the round's check outcomes and retried check
   attempts, and how the competitors' runs ended (`round_runs`).

Over all phases: `claimed_twice`, attempts that two asks claimed (a retry is a new attempt), and `agent_errors`.

The last line is one JSON object: this tree's figures, and the baseline's under "baseline" when given.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import json
import math
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PG = os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
DB = "kernelbot_fleet"
REDIS_DB = os.environ.get("BENCH_REDIS_DB", "3")
KEY = "fleet-bench-runner-key-0123456789abcdef"
POOL = "fleet"
DEVICES = 8
READ_TIMEOUT_S = 60  # a user read unanswered this long counts as 60 s (aiohttp's 5-minute default ended the run)
SAMPLE_S = 15.0  # runners.harness.node.SAMPLE_S: how often a real agent runs nvidia-smi
USER_READS = ("/api/v1/leaderboards", "/api/v1/health")

SETUP = """
import django; django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0); call_command("load_demo", verbosity=0)
from runners.models import GpuPool
GpuPool.objects.exclude(name="{pool}").update(enabled=False)
GpuPool.objects.create(name="{pool}")
"""

# run in the measured tree (PYTHONPATH): one JSON line answered per command line read. `dispatch`: a run submitted and
# dispatched here (`dispatch_run`, a worker's task), its dispatch CPU timed; `submit`: submitted only (the workers
# dispatch it, as in production); `round`: the pool's health round started, as the admin's "Check health now" does;
# `state IDS`: those runs' statuses, the pool's pending checks, its nodes by service and its checks since the round
DRIVER = """
import json, sys, time
from collections import Counter
import django; django.setup()
from django.contrib.auth import get_user_model
from django.utils import timezone
from leaderboards import health, lifecycle
from leaderboards.actions import check_submission, do_submit
from leaderboards.models import Leaderboard, Run, RunAttempt, SubmissionMode
from runners.models import GpuPool, Node, PoolCheck
user = get_user_model().objects.create(username="fleet-driver")
board = Leaderboard.objects.filter(gpu_types__name="CPU").order_by("pk").first()
code = open(sys.argv[1], "rb").read()
pool = GpuPool.objects.get(name=sys.argv[2])
round_started = since = None
here = getattr(lifecycle, "dispatch_here", None)  # a tree whose submission dispatches a local pool's run itself
for line in sys.stdin:
    command, _, rest = line.strip().partition(" ")
    if command in ("dispatch", "submit"):
        if here is not None:  # "dispatch": left queued by the submission, dispatched and timed below as before
            lifecycle.dispatch_here = (lambda run_id: None) if command == "dispatch" else here
        submitted = time.time()
        submission = do_submit(user, check_submission(user, board.name, ["CPU"], SubmissionMode.TEST, "k.py", code))
        run = submission.runs.get()
        out = {"run": run.pk, "submitted": submitted}
        if command == "dispatch":
            cpu = time.process_time()
            lifecycle.dispatch_run(run.pk)
            out["cpu_ms"] = 1000 * (time.process_time() - cpu)
        out["t"] = time.time()
    elif command == "round":
        round_started, since = time.time(), timezone.now()
        out = {"checks": len(health.do_start_pool_check(pool)), "t": time.time(),
               "took_s": time.time() - round_started}
    elif command == "state":
        ids = json.loads(rest or "[]")
        checks = PoolCheck.objects.filter(pool=pool)
        latest = checks.filter(started_at__gte=since) if round_started else checks.none()
        internal = Run.objects.filter(submission__leaderboard__internal=True)
        out = {"runs": dict(Counter(Run.objects.filter(pk__in=ids).values_list("status", flat=True))),
               "pending_checks": checks.filter(outcome="pending").count(),
               "round_outcomes": dict(Counter(latest.exclude(outcome="pending").values_list("outcome", flat=True))),
               "nodes": dict(Counter(Node.objects.filter(pool=pool).values_list("service", flat=True))),
               "check_runs": dict(Counter(internal.values_list("status", flat=True))),
               "check_attempts_retried": RunAttempt.objects.filter(run__in=internal, outcome="retried").count(),
               "health": GpuPool.objects.get(pk=pool.pk).health}
    print(json.dumps(out), flush=True)
"""


def env_for(tree: Path, instance: str) -> dict[str, str]:
    return {**os.environ, "DATABASE_URL": f"{PG}/{DB}", "REDIS_URL": f"redis://127.0.0.1:6379/{REDIS_DB}",
            "KERNELBOT_INSTANCE": instance, "DEBUG": "0", "SECRET_KEY": "fleet-bench-only",
            "ALLOWED_HOSTS": "127.0.0.1", "DB_POOL": "1", "LOG_LEVEL": "WARNING", "SECURE_SSL_REDIRECT": "0",
            "KERNELBOT_RUNNER_KEY": KEY, "KERNELBOT_POOL_CHECK_INTERVAL": "0", "KERNELBOT_QUOTA_TEST": "0",
            "KERNELBOT_QUOTA_RANKED": "0", "KERNELBOT_SPREAD_REFRESH_DAYS": "0",
            "DJANGO_SETTINGS_MODULE": "kernelbot.settings", "PYTHONPATH": str(tree)}


def prepare(tree: Path, env: dict[str, str]) -> None:
    for sql in (f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)", f"CREATE DATABASE {DB}"):
        subprocess.run(["psql", f"{PG}/postgres", "-qc", sql], check=True)
    subprocess.run([sys.executable, "-c", SETUP.format(pool=POOL)], cwd=tree, env=env, check=True)


def analyze() -> None:
    """The planner's statistics of the fleet's tables, as autovacuum would have them within its naptime (a minute) on
    a production server: this machine's PostgreSQL runs with autovacuum off, and the plans of a database never
    analyzed are not what a deployment runs."""
    subprocess.run(["psql", f"{PG}/{DB}", "-qc", "ANALYZE"], check=True)


def headers_for(hostname: str) -> dict[str, str]:
    token = hmac.new(KEY.encode(), f"node:{POOL}:{hostname}".encode(), hashlib.sha256).hexdigest()
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}


async def register(base: str, nodes: int, concurrency: int = 50) -> float:
    """Each node registered as its agent does (`NodeAgent.register`: POST nodes/register with its probe report, here
    8 CPU devices), `concurrency` at a time; the seconds it took."""
    import aiohttp

    probe = {"devices": [{"index": d, "name": "CPU", "vendor": "cpu", "uuid": "", "memory_mib": None}
                         for d in range(DEVICES)], "cpu": "fleet bench"}
    gate = asyncio.Semaphore(concurrency)

    async def one(session: aiohttp.ClientSession, hostname: str) -> None:
        body = {"pool": POOL, "hostname": hostname, "probe": probe, "agent": {"version": "fleet-bench"}}
        async with gate, session.post(f"{base}/api/runner/v1/nodes/register", data=json.dumps(body),
                                      headers=headers_for(hostname)) as response:
            answer = await response.json(content_type=None)
            if response.status != 200 or answer.get("out_of_service") or len(answer.get("devices", ())) != DEVICES:
                raise RuntimeError(f"{hostname} not registered: {response.status} {answer}")

    started = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        await asyncio.gather(*(one(session, f"node-{i:05d}") for i in range(nodes)))
    return time.monotonic() - started


def web_command(tree: Path, port: int, unit: str = "kernelbot-web.service") -> list[str]:
    """The tree's own production web server: the ExecStart of its deploy/systemd unit (its granian flags), on this
    interpreter and a free port, logging warnings only."""
    for line in (tree / "deploy" / "systemd" / unit).read_text().splitlines():
        if line.startswith("ExecStart="):
            line = line.removeprefix("ExecStart=").replace("/srv/kernelbot/.venv/bin/python", sys.executable)
            line = re.sub(r"--port \d+", f"--port {port}", line)  # a shell line picks the workers' variable
            app = " kernelbot.asgi:application"
            return shlex.split(line.replace(app, " --log-level warning" + app))
    raise SystemExit(f"{tree}: no ExecStart in deploy/systemd/{unit}")


def start_servers(tree: Path, env: dict[str, str]) -> tuple[list[subprocess.Popen], str, str]:
    """The users' web server and, where the tree has one, the runners' (deploy/systemd/kernelbot-runners.service, where
    the proxy routes /api/runner/), each with 2 workers; returns them, the users' base URL and the agents'."""
    units = ["kernelbot-web.service"] + (["kernelbot-runners.service"] if (
        tree / "deploy" / "systemd" / "kernelbot-runners.service").exists() else [])
    procs, bases = [], []
    for unit in units:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs.append(subprocess.Popen(web_command(tree, port, unit), cwd=tree, start_new_session=True, env={
            "KERNELBOT_WEB_WORKERS": "2", "KERNELBOT_RUNNER_WEB_WORKERS": "2", **env}))
        bases.append(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            time.sleep(0.2)
    time.sleep(2)
    return procs, bases[0], bases[-1]


def cpu_seconds(*pids: int) -> float:
    """User + system CPU of the processes and their children (granian's workers) so far."""
    listed = [str(p) for p in pids]
    for pid in pids:
        listed += subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    total = 0
    for p in listed:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{p}/stat").read_text().rpartition(")")[2].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


async def user_reads(base: str, seconds: float, stop: threading.Event | None = None) -> list[float]:
    import aiohttp

    took = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=READ_TIMEOUT_S)) as session:
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end and not (stop and stop.is_set()):
            started = time.monotonic()
            with contextlib.suppress(TimeoutError):  # unanswered: counted as the time it was given
                async with session.get(base + USER_READS[i % len(USER_READS)]) as response:
                    await response.read()
                    assert response.status == 200, response.status
            took.append(1000 * (time.monotonic() - started))
            i += 1
            await asyncio.sleep(max(0.0, 0.05 - (time.monotonic() - started)))
    return took


def start_workers(tree: Path, env: dict[str, str]) -> subprocess.Popen:
    """The tree's task workers as its deploy/systemd/kernelbot-workers.service starts them, on this interpreter."""
    for line in (tree / "deploy" / "systemd" / "kernelbot-workers.service").read_text().splitlines():
        if line.startswith("ExecStart="):
            command = shlex.split(line.removeprefix("ExecStart=").replace("/srv/kernelbot/.venv/bin/python",
                                                                           sys.executable))
            return subprocess.Popen(command, cwd=tree, env=env, start_new_session=True, stdout=subprocess.DEVNULL)
    raise SystemExit(f"{tree}: no ExecStart in deploy/systemd/kernelbot-workers.service")


class Driver:
    """The DRIVER process of the measured tree: one command, one JSON answer."""

    def __init__(self, tree: Path, env: dict[str, str]):
        code = REPO / "problems/demo/vectoradd_py/solutions/correct.py"
        self.proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(code), POOL], cwd=tree, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, command: str) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


TERMINAL = {"succeeded", "failed", "timed_out", "hacked", "error", "cancelled"}


def ended(state: dict) -> int:
    return sum(n for status, n in state["runs"].items() if status in TERMINAL)


# --- the agents (a subprocess each: `fleet.py --agents BASE FIRST COUNT MODE SAMPLES`) --------------------------------

async def agents(base: str, first: int, count: int, mode: str, sampling: bool, run_s: float) -> None:
    """`run_s` 0: a claimed run keeps its devices and is never run (the idle and claim phases); else each claim is
    carried out as the agent does (`agent.run_attempt`): its job fetched, a progress post halfway through `run_s`
    seconds of "running", its devices freed, and a passing result posted."""
    import aiohttp

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    errors = 0
    running: set[asyncio.Task] = set()

    def error(exc: Exception) -> None:
        nonlocal errors
        errors += 1
        if errors < 5:
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:300]}), flush=True)

    async def execute(session: aiohttp.ClientSession, hostname: str, claim: dict, free: list[int]) -> None:
        route = f"{base}/api/runner/v1/runs/{claim['run']}/{claim['attempt']}/"
        headers = {"Authorization": f"Bearer {claim['token']}", "Content-Type": "application/json"}
        status = 0
        try:
            try:
                async with session.get(route + "job", params={"host": hostname, "gpus": ""},
                                       headers=headers) as response:
                    payload = await response.json(content_type=None)
                    if response.status != 200:
                        raise RuntimeError(f"job {response.status}: {payload}")
                await asyncio.sleep(run_s / 2)
                progress = {"event": "progress", "phase": "test", "done": 1, "total": 2}
                async with session.post(route + "progress", data=json.dumps(progress), headers=headers) as response:
                    await response.read()
                await asyncio.sleep(run_s / 2)
            finally:
                free.extend(claim["devices"])  # before reporting, as the agent does
            result = {"event": "result", "status": "ok", "verdict": "pass", "passed": True,
                      "mode": payload["job"].get("mode", "test"), "error": "",
                      "tests": [{"spec": "fleet", "status": "pass", "message": ""}],
                      "system": {"device": "cpu", "cpu": "fleet bench"}}
            async with session.post(route + "result", data=json.dumps(result), headers=headers) as response:
                status = response.status
                await response.read()
        except Exception as exc:  # a cancelled attempt (409) included: the platform decides, the devices are free
            error(exc)
        print(json.dumps({"done": claim["run"], "attempt": claim["attempt"], "t": time.time(), "status": status}),
              flush=True)

    async def agent(session: aiohttp.ClientSession, i: int) -> None:
        hostname = f"node-{i:05d}"
        headers = headers_for(hostname)
        free = list(range(DEVICES))
        await asyncio.sleep(random.uniform(0, 15 if mode == "wait" else 0.5))
        sampled = -SAMPLE_S
        while not stop.is_set():
            body = {"pool": POOL, "hostname": hostname, "free": sorted(free)}
            if sampling and time.monotonic() - sampled >= SAMPLE_S:
                sampled = time.monotonic()
                body["samples"] = [{"index": d, "utilization": round(random.random(), 2),
                                    "memory_used": random.randrange(80 << 10) << 20, "memory_total": 80 << 30}
                                   for d in range(DEVICES)]
            route = "poll" if mode == "poll" else "wait"
            if mode == "wait":
                body["wait"] = 15
            started = time.monotonic()
            again = False
            try:
                async with session.post(f"{base}/api/runner/v1/nodes/{route}", data=json.dumps(body),
                                        headers=headers) as response:
                    answer = await response.json(content_type=None)
                    if response.status != 200:
                        raise RuntimeError(f"{response.status}: {answer}")
                now = time.time()
                for claim in answer.get("claims", []):
                    free[:] = [d for d in free if d not in claim["devices"]]
                    print(json.dumps({"claim": claim["run"], "attempt": claim["attempt"], "t": now}), flush=True)
                    if run_s:
                        task = asyncio.create_task(execute(session, hostname, claim, free))
                        running.add(task)
                        task.add_done_callback(running.discard)
                again = bool(answer.get("again"))
            except Exception as exc:  # as the agent: say so, ask again after a pause
                error(exc)
                await asyncio.sleep(2)
            if not again and time.monotonic() - started <= 0.5:
                await asyncio.sleep(0.5)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        tasks = [asyncio.create_task(agent(session, i)) for i in range(first, first + count)]
        await stop.wait()
        for task in [*tasks, *running]:
            task.cancel()
        await asyncio.gather(*tasks, *running, return_exceptions=True)
    print(json.dumps({"errors": errors}), flush=True)


def measure(tree: Path, label: str, args) -> dict:
    env = env_for(tree, f"fleet-bench-{label}")
    mode = "wait" if "nodes/wait" in (tree / "leaderboards" / "runner_api.py").read_text() else "poll"
    sampling = "gpu_samples" in (tree / "runners" / "harness" / "node.py").read_text()
    if "nodes/register" not in (tree / "leaderboards" / "runner_api.py").read_text():
        raise SystemExit(f"{label}: its runner API has no nodes/register to register the fleet's nodes with")
    say(f"{label}: preparing ({mode} agents)")
    prepare(tree, env)
    servers, base, runners = start_servers(tree, env)
    web_pids = [server.pid for server in servers]
    fleet: list[subprocess.Popen] = []
    readers: list[threading.Thread] = []
    outputs: list[str] = []
    workers: subprocess.Popen | None = None
    work: dict = {}
    try:
        registered = asyncio.run(register(runners, args.nodes))
        say(f"{label}: {args.nodes} nodes registered over nodes/register in {registered:.1f} s")
        analyze()
        nofleet = asyncio.run(user_reads(base, args.seconds))
        say(f"{label}: no fleet: user p95 {percentile(nofleet, 0.95):.1f} ms; starting the fleet")
        per = -(-args.nodes // args.clients)
        for c in range(args.clients):
            count = min(per, args.nodes - c * per)
            agent_proc = subprocess.Popen([sys.executable, __file__, "--agents", runners, str(c * per), str(count),
                                           mode, str(int(sampling)), str(args.run_seconds)], stdout=subprocess.PIPE,
                                          text=True, env={**os.environ, "PYTHONPATH": ""})
            fleet.append(agent_proc)  # its lines read as they come: a full pipe would stop its agents' event loop
            readers.append(threading.Thread(target=lambda p=agent_proc: outputs.extend(p.stdout), daemon=True))
            readers[-1].start()
        cores = len(os.sched_getaffinity(0))
        cpu0, wall0 = cpu_seconds(*web_pids), time.monotonic()
        # the first asks are spread over one heartbeat; each node's first asks to each web process are full ones
        time.sleep(args.settle if mode == "wait" else 5)
        settling = (cpu_seconds(*web_pids) - cpu0) / ((time.monotonic() - wall0) * cores)
        cpu0, wall0 = cpu_seconds(*web_pids), time.monotonic()
        time.sleep(args.seconds)
        share = (cpu_seconds(*web_pids) - cpu0) / ((time.monotonic() - wall0) * cores)
        fleet_reads = asyncio.run(user_reads(base, args.seconds))
        say(f"{label}: idle fleet: web CPU share {share:.3f}, user p95 {percentile(fleet_reads, 0.95):.1f} ms")
        driver = Driver(tree, env)
        dispatched, submitted, dispatch_cpu = {}, {}, []
        for _ in range(args.runs):
            line = driver.ask("dispatch")
            dispatched[line["run"]] = line["t"]
            submitted[line["run"]] = line.get("submitted", line["t"])
            dispatch_cpu += [line["cpu_ms"]] if "cpu_ms" in line else []
            time.sleep(args.gap)
        time.sleep(3 if mode == "wait" else 10)
        if args.burst or args.round:
            analyze()
            workers = start_workers(tree, env)
            first = driver.ask("submit")["run"]  # the workers are up once they dispatch a run that then ends
            wait_for(driver, [first], lambda s: ended(s) == 1, 120)
            parts = {"web": web_pids, "workers": [workers.pid], "agents": [a.pid for a in fleet],
                     "driver": [driver.proc.pid]}
            work = work_phases(driver, base, web_pids, cores, args, label, parts)
        driver.close()
    finally:
        for agent_proc in fleet:
            agent_proc.send_signal(signal.SIGTERM)
        for agent_proc, reader in zip(fleet, readers, strict=True):
            agent_proc.wait(timeout=60)
            reader.join(timeout=60)
        for server in filter(None, (workers, *servers)):
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:  # a worker stuck behind a backlog of polls (the previous release)
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(timeout=30)
    claims, errors, messages = {}, 0, []
    for line in "".join(outputs).splitlines():
        event = json.loads(line)
        if "claim" in event:
            claims.setdefault((event["claim"], event.get("attempt")), []).append(event["t"])
        elif "errors" in event:
            errors += event["errors"]
        elif "error" in event:
            messages.append(event["error"])
    first_claim: dict[int, float] = {}
    for (run, _), times in claims.items():
        first_claim[run] = min(first_claim.get(run, math.inf), *times)
    latencies = [1000 * (first_claim[run] - t) for run, t in dispatched.items() if run in first_claim]
    from_submission = [1000 * (first_claim[run] - t) for run, t in submitted.items() if run in first_claim]
    result = {"nodes": args.nodes, "protocol": mode, "web_cpu_share": round(share, 3),
              "web_cpu_share_settling": round(settling, 3), "settle_s": args.settle if mode == "wait" else 5,
              "register_s": round(registered, 1),
              "claim_p50_ms": rnd(percentile(latencies, 0.5)), "claim_p95_ms": rnd(percentile(latencies, 0.95)),
              "claimed": len(latencies), "runs": args.runs, "gap_s": args.gap,
              "submit_claim_p50_ms": rnd(percentile(from_submission, 0.5)),
              "submit_claim_p95_ms": rnd(percentile(from_submission, 0.95)),
              "dispatch_cpu_ms_mean": rnd(sum(dispatch_cpu) / len(dispatch_cpu)) if dispatch_cpu else None,
              "dispatch_cpu_ms_p95": rnd(percentile(dispatch_cpu, 0.95)), "devices": args.nodes * DEVICES,
              "user_p95_ms": rnd(percentile(fleet_reads, 0.95)), "user_nofleet_p95_ms": rnd(percentile(nofleet, 0.95)),
              "user_reads": len(fleet_reads), "cores": cores}
    if work.get("burst_submitted"):
        burst = [1000 * (first_claim[run] - t) for run, t in work.pop("burst_submitted").items() if run in first_claim]
        work.update(burst_claimed=len(burst), burst_submit_claim_p50_ms=rnd(percentile(burst, 0.5)),
                    burst_submit_claim_p95_ms=rnd(percentile(burst, 0.95)))
    result.update(work)
    result.update(claimed_twice=sum(len(ts) > 1 for ts in claims.values()),  # one attempt claimed by two asks
                  attempts_claimed=len(claims), runs_claimed=len(first_claim), agent_errors=errors)
    if "round_user_p95_ms" in result and result["user_p95_ms"]:
        result["round_user_p95_vs_idle"] = round(result["round_user_p95_ms"] / result["user_p95_ms"], 2)
    if messages:
        result["agent_error_examples"] = messages[:3]
    say(f"{label}: {json.dumps(result)}")
    return result


def cpu_by_part(parts: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds so far of each part (its processes and their children) and of PostgreSQL's processes."""
    postgres = subprocess.run(["pgrep", "-u", "postgres"], capture_output=True, text=True).stdout.split()
    return {**{name: sum(cpu_seconds(pid) for pid in pids) for name, pids in parts.items()},
            "postgres": sum(cpu_seconds(int(pid)) for pid in postgres)}


def work_phases(driver: Driver, base: str, web_pids: list[int], cores: int, args, label: str,
                parts: dict[str, list[int]]) -> dict:
    """With the tree's workers dispatching, as in production: a burst of `--burst` submissions, then a health round
    forced on the (healthy) pool while users read the API and `--round-runs` competitors' runs are submitted, one
    every `--round-gap` s; the round is over when no check of the pool is pending."""
    out: dict = {}
    if args.burst:
        ids, submitted = [], {}
        cpu0, started = cpu_by_part(parts), time.monotonic()
        for _ in range(args.burst):
            line = driver.ask("submit")
            ids.append(line["run"])
            submitted[line["run"]] = line["submitted"]
        out["burst_submit_s"] = round(time.monotonic() - started, 1)
        state = wait_for(driver, ids, lambda s: ended(s) == len(ids), args.burst_timeout)
        out.update(burst=args.burst, burst_runs=state["runs"], burst_s=round(time.monotonic() - started, 1),
                   burst_submitted=submitted,
                   burst_cpu_s={k: round(v - cpu0[k], 1) for k, v in cpu_by_part(parts).items()})
        say(f"{label}: burst of {args.burst}: {state['runs']} after {out['burst_s']} s")
    if args.round:
        stop, reads = threading.Event(), []
        reader = threading.Thread(target=lambda: reads.extend(asyncio.run(user_reads(base, 1e9, stop))))
        cpu0, wall0 = cpu_seconds(*web_pids), time.monotonic()
        reader.start()
        started = driver.ask("round")
        say(f"{label}: health round started: {started['checks']} checks in {started['took_s']:.1f} s")
        ids: list[int] = []
        next_submit, deadline, state = time.monotonic(), time.monotonic() + args.round_timeout, {}
        while time.monotonic() < deadline:
            if len(ids) < args.round_runs and time.monotonic() >= next_submit:
                ids.append(driver.ask("submit")["run"])
                next_submit += args.round_gap
            state = driver.ask(f"state {json.dumps(ids)}")
            if not state["pending_checks"] and len(ids) == args.round_runs and ended(state) == len(ids):
                break
            time.sleep(1)
        round_s = time.monotonic() - wall0
        round_share = (cpu_seconds(*web_pids) - cpu0) / (round_s * cores)
        stop.set()
        reader.join()
        state = wait_for(driver, ids, lambda s: ended(s) == len(ids), 60)  # the competitors' runs still going
        in_service = state["nodes"].get("in_service", 0)
        out.update(round_s=round(round_s, 1), round_done=not state["pending_checks"],
                   round_outcomes=state["round_outcomes"], round_check_runs=state["check_runs"],
                   round_check_attempts_retried=state["check_attempts_retried"], nodes_after=state["nodes"],
                   out_of_service_after=sum(state["nodes"].values()) - in_service, pool_health=state["health"],
                   round_runs=state["runs"], round_runs_succeeded=state["runs"].get("succeeded", 0),
                   round_web_cpu_share=round(round_share, 3), round_user_p95_ms=rnd(percentile(reads, 0.95)),
                   round_user_reads=len(reads))
        say(f"{label}: round: {json.dumps(out)}")
    return out


def wait_for(driver: Driver, ids: list[int], done, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while not done(state := driver.ask(f"state {json.dumps(ids)}")) and time.monotonic() < deadline:
        time.sleep(1)
    return state


def rnd(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def say(message: str) -> None:
    print(f"[fleet] {message}", file=sys.stderr, flush=True)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--agents":
        base, first, count, mode, sampling = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
        asyncio.run(agents(base, first, count, mode, sampling == "1", float(sys.argv[7])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--settle", type=float, default=31, help="seconds from the fleet's start to the measuring")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--gap", type=float, default=0.5, help="seconds between submissions (0: a burst)")
    parser.add_argument("--clients", type=int, default=2, help="agent processes")
    parser.add_argument("--run-seconds", type=float, default=1.0,
                        help="how long an agent 'runs' each claimed run before it reports a pass (0: never runs it)")
    parser.add_argument("--burst", type=int, default=200, help="work phase: submissions at once (0: none)")
    parser.add_argument("--burst-timeout", type=float, default=300)
    parser.add_argument("--round", action=argparse.BooleanOptionalAction, default=True,
                        help="work phase: a forced health round on the pool")
    parser.add_argument("--round-runs", type=int, default=60, help="competitors' runs submitted during the round")
    parser.add_argument("--round-gap", type=float, default=1.0)
    parser.add_argument("--round-timeout", type=float, default=600)
    parser.add_argument("--baseline", metavar="REF", help="git ref of the previous release, measured first")
    args = parser.parse_args()
    out = {}
    if args.baseline:
        with tempfile.TemporaryDirectory() as tmp:
            archive = subprocess.run(["git", "archive", args.baseline], cwd=REPO, check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            out["baseline"] = {"ref": args.baseline, **measure(Path(tmp), "baseline", args)}
    out = {**measure(REPO, "current", args), **out}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
