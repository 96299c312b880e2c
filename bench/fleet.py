"""Issue 42: a fleet of node agents on the production web layout; what idle agents cost and how soon a run is claimed.

    python bench/fleet.py [--nodes 1000] [--seconds 20] [--runs 20] [--baseline REF] [--clients 2]

For each tree (with `--baseline REF`: that git ref, exported into a temporary directory, first; then this tree),
side by side in one invocation: database `kernelbot_fleet` on $BENCH_PG (dropped, created, migrated by the tree's
own code, the demo loaded), a local pool `fleet` (the demo's own pool disabled) of `--nodes` nodes of 8 CPU devices
each, registered over the wire as agents do (`nodes/register` with a probe report, 50 at a time, before the measured
phases; how long it took is printed and reported as `register_s`), and the web layout of docs/operations.md:
the tree's own deploy/systemd/kernelbot-web.service command (granian, 2 workers, its flags), PostgreSQL, Redis
(db $BENCH_REDIS_DB, default 3, under a deployment name of its own), `DB_POOL=1`. No `manage.py workers`: this
process dispatches each run itself (`dispatch_run`, what a worker's task does), so the claim latency is the agents'
alone.

The agents speak the node agent's exact wire protocol (`runners/harness/node.py` of the tree measured), many per
process (`--clients` processes of asyncio + aiohttp): Bearer HMAC(runner key, "node:fleet:HOST"), `free` listing
the node's free devices; a tree whose agent waits (`nodes/wait`, `{"wait": 15}`, asked again at once when the
answer says `again`, else after the poll interval) is driven that way, an older one polls `nodes/poll` every 0.5 s.
Where the tree's agent samples its devices, each ask carries 8 devices' `samples` when the agent would have taken
new ones (every 15 s, as nvidia-smi is run: `node.SAMPLE_S`), varying as a busy GPU's figures do.
Claimed runs keep their devices (never run). Phases, each on the same server:

1. no fleet: `--seconds` of API reads (GET /api/v1/leaderboards and /api/v1/health, one after the other, 20 a
   second): `user_nofleet_p95_ms`;
2. the fleet starts (first asks spread over one heartbeat interval) and settles for `--settle` seconds (default
   two heartbeats: a web process answers a node's ask without the database only once it has seen one full ask of
   it, so the first interval is a fleet's start, not its steady state; its share is `web_cpu_share_settling`);
   then for `--seconds` the idle fleet alone, the web processes' CPU time counted: `web_cpu_share` = CPU seconds
   of granian and its workers / (wall seconds x cores); then for `--seconds` the same reads again (`user_p95_ms`);
3. `--runs` runs submitted and dispatched one every `--gap` s (0.5; 0: a burst): `claim_p50_ms`/`claim_p95_ms` from
   dispatch committed to the claiming agent's answer, `submit_claim_p50_ms`/`submit_claim_p95_ms` from the
   submission (one clock: this machine's), and `dispatch_cpu_ms_mean`/`_p95`, the dispatching process's CPU time per
   `dispatch_run` with `devices` devices in the pool (a worker's cost per dispatch).

The last line is one JSON object: this tree's figures, and the baseline's under "baseline" when given.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
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

# run in the measured tree (PYTHONPATH): submits and dispatches a run per line read, printing when it was dispatched
DRIVER = """
import json, sys, time
import django; django.setup()
from django.contrib.auth import get_user_model
from leaderboards import lifecycle
from leaderboards.actions import check_submission, do_submit
from leaderboards.models import Leaderboard, SubmissionMode
user = get_user_model().objects.create(username="fleet-driver")
board = Leaderboard.objects.filter(gpu_types__name="CPU").order_by("pk").first()
code = open(sys.argv[1], "rb").read()
for line in sys.stdin:
    submitted = time.time()
    submission = do_submit(user, check_submission(user, board.name, ["CPU"], SubmissionMode.TEST, "k.py", code))
    run = submission.runs.get()
    cpu = time.process_time()
    lifecycle.dispatch_run(run.pk)
    cpu = time.process_time() - cpu
    print(json.dumps({"run": run.pk, "t": time.time(), "submitted": submitted, "cpu_ms": 1000 * cpu}), flush=True)
"""


def env_for(tree: Path, instance: str) -> dict[str, str]:
    return {**os.environ, "DATABASE_URL": f"{PG}/{DB}", "REDIS_URL": f"redis://127.0.0.1:6379/{REDIS_DB}",
            "KERNELBOT_INSTANCE": instance, "DEBUG": "0", "SECRET_KEY": "fleet-bench-only",
            "ALLOWED_HOSTS": "127.0.0.1", "DB_POOL": "1", "LOG_LEVEL": "WARNING", "SECURE_SSL_REDIRECT": "0",
            "KERNELBOT_RUNNER_KEY": KEY, "KERNELBOT_QUOTA_TEST": "0", "KERNELBOT_QUOTA_RANKED": "0",
            "DJANGO_SETTINGS_MODULE": "kernelbot.settings", "PYTHONPATH": str(tree)}


def prepare(tree: Path, env: dict[str, str]) -> None:
    for sql in (f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)", f"CREATE DATABASE {DB}"):
        subprocess.run(["psql", f"{PG}/postgres", "-qc", sql], check=True)
    subprocess.run([sys.executable, "-c", SETUP.format(pool=POOL)], cwd=tree, env=env, check=True)


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


def web_command(tree: Path, port: int) -> list[str]:
    """The tree's own production web server: the ExecStart of its deploy/systemd/kernelbot-web.service (its granian
    flags), on this interpreter and a free port, logging warnings only."""
    for line in (tree / "deploy" / "systemd" / "kernelbot-web.service").read_text().splitlines():
        if line.startswith("ExecStart="):
            line = line.removeprefix("ExecStart=").replace("/srv/kernelbot/.venv/bin/python", sys.executable)
            line = line.replace("--port 8000", f"--port {port}")  # a shell line picks KERNELBOT_WEB_WORKERS
            app = " kernelbot.asgi:application"
            return shlex.split(line.replace(app, " --log-level warning" + app))
    raise SystemExit(f"{tree}: no ExecStart in deploy/systemd/kernelbot-web.service")


def start_server(tree: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(web_command(tree, port), cwd=tree, env={"KERNELBOT_WEB_WORKERS": "2", **env},
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            break
        time.sleep(0.2)
    time.sleep(2)
    return proc, base


def cpu_seconds(pid: int) -> float:
    """User + system CPU of the process and its children (granian's workers) so far."""
    pids = [str(pid), *subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()]
    total = 0
    for p in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{p}/stat").read_text().rpartition(")")[2].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


async def user_reads(base: str, seconds: float) -> list[float]:
    import aiohttp

    took = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=READ_TIMEOUT_S)) as session:
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            started = time.monotonic()
            with contextlib.suppress(TimeoutError):  # unanswered: counted as the time it was given
                async with session.get(base + USER_READS[i % len(USER_READS)]) as response:
                    await response.read()
                    assert response.status == 200, response.status
            took.append(1000 * (time.monotonic() - started))
            i += 1
            await asyncio.sleep(max(0.0, 0.05 - (time.monotonic() - started)))
    return took


# --- the agents (a subprocess each: `fleet.py --agents BASE FIRST COUNT MODE SAMPLES`) --------------------------------

async def agents(base: str, first: int, count: int, mode: str, sampling: bool) -> None:
    import aiohttp

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    errors = 0

    async def agent(session: aiohttp.ClientSession, i: int) -> None:
        nonlocal errors
        hostname = f"node-{i:05d}"
        headers = headers_for(hostname)
        free = list(range(DEVICES))
        await asyncio.sleep(random.uniform(0, 15 if mode == "wait" else 0.5))
        sampled = -SAMPLE_S
        while not stop.is_set():
            body = {"pool": POOL, "hostname": hostname, "free": free}
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
                    free = [d for d in free if d not in claim["devices"]]
                    print(json.dumps({"claim": claim["run"], "t": now}), flush=True)
                again = bool(answer.get("again"))
            except Exception as exc:  # as the agent: say so, ask again after a pause
                errors += 1
                if errors < 5:
                    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:300]}), flush=True)
                await asyncio.sleep(2)
            if not again and time.monotonic() - started <= 0.5:
                await asyncio.sleep(0.5)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        tasks = [asyncio.create_task(agent(session, i)) for i in range(first, first + count)]
        await stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps({"errors": errors}), flush=True)


def measure(tree: Path, label: str, args) -> dict:
    env = env_for(tree, f"fleet-bench-{label}")
    mode = "wait" if "nodes/wait" in (tree / "leaderboards" / "runner_api.py").read_text() else "poll"
    sampling = "gpu_samples" in (tree / "runners" / "harness" / "node.py").read_text()
    if "nodes/register" not in (tree / "leaderboards" / "runner_api.py").read_text():
        raise SystemExit(f"{label}: its runner API has no nodes/register to register the fleet's nodes with")
    say(f"{label}: preparing ({mode} agents)")
    prepare(tree, env)
    proc, base = start_server(tree, env)
    fleet: list[subprocess.Popen] = []
    try:
        registered = asyncio.run(register(base, args.nodes))
        say(f"{label}: {args.nodes} nodes registered over nodes/register in {registered:.1f} s")
        nofleet = asyncio.run(user_reads(base, args.seconds))
        say(f"{label}: no fleet: user p95 {percentile(nofleet, 0.95):.1f} ms; starting the fleet")
        per = -(-args.nodes // args.clients)
        for c in range(args.clients):
            count = min(per, args.nodes - c * per)
            fleet.append(subprocess.Popen([sys.executable, __file__, "--agents", base, str(c * per), str(count), mode,
                                           str(int(sampling))], stdout=subprocess.PIPE, text=True,
                                          env={**os.environ, "PYTHONPATH": ""}))
        cores = len(os.sched_getaffinity(0))
        cpu0, wall0 = cpu_seconds(proc.pid), time.monotonic()
        # the first asks are spread over one heartbeat; each node's first asks to each web process are full ones
        time.sleep(args.settle if mode == "wait" else 5)
        settling = (cpu_seconds(proc.pid) - cpu0) / ((time.monotonic() - wall0) * cores)
        cpu0, wall0 = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(args.seconds)
        share = (cpu_seconds(proc.pid) - cpu0) / ((time.monotonic() - wall0) * cores)
        fleet_reads = asyncio.run(user_reads(base, args.seconds))
        say(f"{label}: idle fleet: web CPU share {share:.3f}, user p95 {percentile(fleet_reads, 0.95):.1f} ms")
        driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(REPO / "problems/demo/vectoradd_py/solutions/"
                                                                     "correct.py")],
                                  cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        dispatched, submitted, dispatch_cpu = {}, {}, []
        for _ in range(args.runs):
            driver.stdin.write("\n")
            driver.stdin.flush()
            line = json.loads(driver.stdout.readline())
            dispatched[line["run"]] = line["t"]
            submitted[line["run"]] = line.get("submitted", line["t"])
            dispatch_cpu += [line["cpu_ms"]] if "cpu_ms" in line else []
            time.sleep(args.gap)
        driver.stdin.close()
        driver.wait(timeout=60)
        time.sleep(3 if mode == "wait" else 10)
    finally:
        for agent_proc in fleet:
            agent_proc.send_signal(signal.SIGTERM)
        outputs = [agent_proc.communicate(timeout=60)[0] for agent_proc in fleet]
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # a worker stuck behind a backlog of polls (the previous release)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    claims, errors, messages = {}, 0, []
    for line in "".join(outputs).splitlines():
        event = json.loads(line)
        if "claim" in event:
            claims.setdefault(event["claim"], []).append(event["t"])
        elif "errors" in event:
            errors += event["errors"]
        else:
            messages.append(event["error"])
    latencies = [1000 * (min(claims[run]) - t) for run, t in dispatched.items() if run in claims]
    from_submission = [1000 * (min(claims[run]) - t) for run, t in submitted.items() if run in claims]
    result = {"nodes": args.nodes, "protocol": mode, "web_cpu_share": round(share, 3),
              "web_cpu_share_settling": round(settling, 3), "settle_s": args.settle if mode == "wait" else 5,
              "register_s": round(registered, 1),
              "claim_p50_ms": rnd(percentile(latencies, 0.5)), "claim_p95_ms": rnd(percentile(latencies, 0.95)),
              "claimed": len(latencies), "runs": args.runs, "gap_s": args.gap,
              "submit_claim_p50_ms": rnd(percentile(from_submission, 0.5)),
              "submit_claim_p95_ms": rnd(percentile(from_submission, 0.95)),
              "dispatch_cpu_ms_mean": rnd(sum(dispatch_cpu) / len(dispatch_cpu)) if dispatch_cpu else None,
              "dispatch_cpu_ms_p95": rnd(percentile(dispatch_cpu, 0.95)), "devices": args.nodes * DEVICES,
              "claimed_twice": sum(len(ts) > 1 for ts in claims.values()),
              "user_p95_ms": rnd(percentile(fleet_reads, 0.95)), "user_nofleet_p95_ms": rnd(percentile(nofleet, 0.95)),
              "user_reads": len(fleet_reads), "agent_errors": errors, "cores": cores}
    if messages:
        result["agent_error_examples"] = messages[:3]
    say(f"{label}: {json.dumps(result)}")
    return result


def rnd(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def say(message: str) -> None:
    print(f"[fleet] {message}", file=sys.stderr, flush=True)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--agents":
        base, first, count, mode, sampling = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
        asyncio.run(agents(base, first, count, mode, sampling == "1"))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--settle", type=float, default=31, help="seconds from the fleet's start to the measuring")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--gap", type=float, default=0.5, help="seconds between submissions (0: a burst)")
    parser.add_argument("--clients", type=int, default=2, help="agent processes")
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
