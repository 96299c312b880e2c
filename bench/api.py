"""API throughput and open streams, against a real server process on 127.0.0.1 and PostgreSQL.

    python bench/api.py submit  [-n 3000] [-c 32] [--server granian|uvicorn|daphne] [--workers 2] [--client wrk]
    python bench/api.py streams [-n 500] [--hold 20] [--server ...]
    python bench/api.py health  [--seconds 20] [-c 32] [--server ...]   # wrk on GET /api/v1/health
    python bench/api.py submit|health --against REF [--rounds 3] ...   # by turns with git REF: ratio of medians

Creates (or resets) the database `kernelbot_bench` on $BENCH_PG (default postgres://postgres@127.0.0.1:5432),
migrates it, loads the demo, creates 50 users with tokens, and starts the server with unlimited quotas and
the django-q2 broker on Redis db 5 (no worker runs: `submit` measures accepted-and-queued).
`submit`: popcorn-cli's exact `POST /popcorn/submission/<lb>/CPU/test` (raw multipart) with `-c` requests in
flight, from an aiohttp client (`-n` requests) or from wrk (`--client wrk`, `--seconds` long; a C client, so the
load generator takes less of the 2 shared cores than aiohttp's ~2.3 ms of CPU per request); every answer must be
200 with `status: accepted`, and the database must hold one submission per accepted answer (plus at most the
`-c` requests wrk leaves unanswered when it stops).
`health`: the request path's floor. wrk is Debian's package `wrk`.
`streams`: one queued submission, `-n` concurrent `GET /api/v1/submissions/<id>/events` held open for
`--hold` seconds; each must deliver its first event and stay open without error."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parent.parent
PG = os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
DB_URL = f"{PG}/kernelbot_bench"
SOLUTION = (REPO / "problems/demo/vectoradd_py/solutions/correct.py").read_bytes()


def server_env() -> dict[str, str]:
    return {**os.environ, "DATABASE_URL": DB_URL, "REDIS_URL": "redis://127.0.0.1:6379/5", "DEBUG": "0",
            "SECRET_KEY": "bench-only", "ALLOWED_HOSTS": "127.0.0.1", "DB_POOL": "1", "LOG_LEVEL": "WARNING",
            "SECURE_SSL_REDIRECT": "0",  # plain HTTP on loopback (production sits behind a TLS proxy)
            "KERNELBOT_QUOTA_TEST": "0", "KERNELBOT_QUOTA_RANKED": "0", "DJANGO_SETTINGS_MODULE": "kernelbot.settings"}


def prepare(tree: Path = REPO) -> list[str]:
    subprocess.run(["psql", PG + "/postgres", "-qc", "DROP DATABASE IF EXISTS kernelbot_bench WITH (FORCE)"],
                   check=True)
    subprocess.run(["psql", PG + "/postgres", "-qc", "CREATE DATABASE kernelbot_bench"], check=True)
    script = """
import django; django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0); call_command("load_demo", verbosity=0)
from django.contrib.auth import get_user_model
from leaderboards.access.actions import do_create_token
for i in range(50):
    print(do_create_token(get_user_model().objects.create(username=f"bench{i}"))[1])
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=tree, env={**server_env(), "PYTHONPATH": str(tree)},
                         check=True, capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.startswith("kb_")]


def start_server(kind: str, workers: int, tree: Path = REPO) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if kind == "granian":  # the production server (docs/operations.md)
        cmd = [sys.executable, "-m", "granian", "--interface", "asginl", "--port", str(port), "--workers",
               str(workers), "--log-level", "warning", "--no-ws", "kernelbot.asgi:application"]
    elif kind == "uvicorn":
        cmd = [sys.executable, "-m", "uvicorn", "kernelbot.asgi:application", "--port", str(port), "--workers",
               str(workers), "--no-access-log", "--log-level", "warning"]
    else:
        cmd = [sys.executable, "-m", "daphne", "-p", str(port), "--verbosity", "0", "kernelbot.asgi:application"]
    proc = subprocess.Popen(cmd, cwd=tree, env={**server_env(), "PYTHONPATH": str(tree)})
    base = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            time.sleep(0.2)
    time.sleep(1)
    return proc, base


def body() -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    data = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"correct.py\"\r\n\r\n"
            ).encode() + SOLUTION + f"\r\n--{boundary}--\r\n".encode()
    return data, f"multipart/form-data; boundary={boundary}"


async def submit(base: str, tokens: list[str], n: int, concurrency: int) -> dict:
    data, content_type = body()
    latencies: list[float] = []
    errors: list[str] = []
    todo = iter(range(n))

    async def worker(session: aiohttp.ClientSession, k: int) -> None:
        for i in todo:
            headers = {"X-Popcorn-Cli-Id": tokens[(i + k) % len(tokens)], "Content-Type": content_type}
            t0 = time.perf_counter()
            async with session.post(f"{base}/popcorn/submission/vectoradd/CPU/test", data=data,
                                    headers=headers) as r:
                payload = await r.json(content_type=None)
                if r.status != 200 or payload.get("status") != "accepted":
                    errors.append(f"{r.status} {payload}")
            latencies.append(time.perf_counter() - t0)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        for _ in range(2):  # warm-up
            await session.get(f"{base}/api/v1/health")
        started = time.perf_counter()
        await asyncio.gather(*(worker(session, k) for k in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {"n": n, "elapsed": elapsed, "rate": n / elapsed, "errors": len(errors), "first_error": errors[:1],
            "p50_ms": 1000 * statistics.median(latencies), "p95_ms": 1000 * latencies[int(0.95 * len(latencies))]}


WRK_SUMMARY = """
bad, first_bad, threads = 0, "", {}  -- bad and first_bad: per-thread globals, read by done() through thread:get
function setup(thread) table.insert(threads, thread) end
function done(summary, latency, requests)
  local errors, first = 0, ""
  for _, t in ipairs(threads) do
    errors = errors + t:get("bad")
    if first == "" then first = t:get("first_bad") end
  end
  io.write(string.format('{"requests": %d, "seconds": %f, "errors": %d, "socket_errors": %d, "p50_ms": %f, '
    .. '"p95_ms": %f, "first_error": %q}\\n', summary.requests, summary.duration / 1e6, errors,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.status
    + summary.errors.timeout, latency:percentile(50) / 1000, latency:percentile(95) / 1000, first))
end
"""
SUBMIT_SCRIPT = """
local tokens, body, ctype, n = %s, %s, %s, 0
function request()
  n = n + 1
  return wrk.format("POST", "/popcorn/submission/vectoradd/CPU/test",
                    {["Content-Type"] = ctype, ["X-Popcorn-Cli-Id"] = tokens[n %% #tokens + 1]}, body)
end
function response(status, headers, resp)
  if status ~= 200 or not resp:find('"status": "accepted"', 1, true) then
    bad = bad + 1
    if first_bad == "" then first_bad = status .. " " .. resp:sub(1, 200) end
  end
end
"""


def lua(value) -> str:
    if isinstance(value, list):
        return "{" + ", ".join(lua(v) for v in value) + "}"
    return "\"" + "".join(c if c.isalnum() or c in " _-./;=" else f"\\{ord(c):03d}" for c in value) + "\""


def run_wrk(url: str, script: str, seconds: int, concurrency: int) -> dict:
    """A 2 s warm-up, then `seconds` of load; the summary that WRK_SUMMARY's done() prints."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as file:
        file.write(script + WRK_SUMMARY)
        file.flush()
        command = ["wrk", "-t1", f"-c{concurrency}", "--timeout", "10s", "-s", file.name, url]
        warm = subprocess.run([*command, "-d2s"], capture_output=True, text=True)
        if warm.returncode:
            raise SystemExit(f"wrk failed: {warm.stdout}{warm.stderr}")
        time.sleep(1)  # let the warm-up's last requests land
        counted = submissions_in_db()
        out = subprocess.run([*command, f"-d{seconds}s"], check=True, capture_output=True, text=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    return {**result, "submissions_before": counted}


def submit_wrk(base: str, tokens: list[str], seconds: int, concurrency: int) -> dict:
    data, content_type = body()
    result = run_wrk(base, SUBMIT_SCRIPT % (lua(tokens), lua(data.decode()), lua(content_type)), seconds,
                     concurrency)
    time.sleep(1)
    stored = submissions_in_db() - result["submissions_before"]  # wrk stops with up to `concurrency` unanswered
    accepted = result["requests"] - result["errors"]
    return {"n": result["requests"], "elapsed": result["seconds"], "rate": accepted / result["seconds"],
            "errors": result["errors"] + result["socket_errors"], "first_error": result["first_error"],
            "stored": stored, "stored_ok": 0 <= stored - accepted <= concurrency, "p50_ms": result["p50_ms"],
            "p95_ms": result["p95_ms"]}


def health_wrk(base: str, seconds: int, concurrency: int) -> dict:
    """The request path's floor: `GET /api/v1/health` (middleware, ninja, one `SELECT 1`)."""
    result = run_wrk(f"{base}/api/v1/health", "", seconds, concurrency)
    return {"n": result["requests"], "elapsed": result["seconds"], "rate": result["requests"] / result["seconds"],
            "errors": result["errors"] + result["socket_errors"], "p50_ms": result["p50_ms"],
            "p95_ms": result["p95_ms"]}


def submissions_in_db() -> int:
    out = subprocess.run(["psql", DB_URL, "-Atc", "SELECT count(*) FROM leaderboards_submission"], check=True,
                         capture_output=True, text=True).stdout
    return int(out)


async def streams(base: str, token: str, n: int, hold: float) -> dict:
    data, content_type = body()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=None)) as session:
        async with session.post(f"{base}/popcorn/submission/vectoradd/CPU/test", data=data,
                                headers={"X-Popcorn-Cli-Id": token, "Content-Type": content_type}) as r:
            sub_id = (await r.json())["details"]["id"]
        opened, errors, first = 0, [], []

        async def one() -> None:
            nonlocal opened
            t0 = time.perf_counter()
            try:
                async with session.get(f"{base}/api/v1/submissions/{sub_id}/events",
                                       headers={"Authorization": f"Bearer {token}"}) as resp:
                    if resp.status != 200:
                        errors.append(resp.status)
                        return
                    await resp.content.readuntil(b"\n\n")
                    first.append(time.perf_counter() - t0)
                    opened += 1
                    deadline = time.perf_counter() + hold
                    while time.perf_counter() < deadline:
                        try:
                            await asyncio.wait_for(resp.content.readuntil(b"\n\n"), deadline - time.perf_counter())
                        except TimeoutError:
                            break
                        if resp.content.at_eof():
                            errors.append("closed early")
                            return
            except Exception as exc:
                errors.append(type(exc).__name__)

        started = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
    first.sort()
    return {"n": n, "opened": opened, "errors": len(errors), "error_kinds": sorted(set(map(str, errors)))[:3],
            "first_event_p50_ms": 1000 * statistics.median(first) if first else None,
            "first_event_max_ms": 1000 * first[-1] if first else None, "elapsed": time.perf_counter() - started}


def server_cpu_seconds(proc: subprocess.Popen) -> float:
    """User + system CPU of the server process and its workers so far."""
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    total = 0
    for pid in [str(proc.pid), *children]:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def host_speed_ns() -> float:
    """ns per `sum(range(100))`: this shared machine's speed drifts by up to 2x within minutes."""
    started = time.perf_counter()
    for _ in range(100_000):
        sum(range(100))
    return (time.perf_counter() - started) * 1e4


def run_once(args, tree: Path) -> dict:
    tokens = prepare(tree)  # each tree migrates its own schema
    speed = host_speed_ns()
    proc, base = start_server(args.server, args.workers, tree)
    try:
        cpu_before = server_cpu_seconds(proc)
        if args.what == "health":
            result = health_wrk(base, args.seconds, args.c)
        elif args.what == "submit" and args.client == "wrk":
            result = submit_wrk(base, tokens, args.seconds, args.c)
        elif args.what == "submit":
            result = asyncio.run(submit(base, tokens, args.n or 3000, args.c))
        else:
            result = asyncio.run(streams(base, tokens[0], args.n or 500, args.hold))
        result["server_cpu_ms_per_request"] = 1000 * (server_cpu_seconds(proc) - cpu_before) / result["n"]
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    client = "wrk" if args.what == "health" else args.client
    return {"server": f"{args.server} x{args.workers}", "client": client, "host_ns": speed, **result}


def against(args) -> None:
    """Alternate runs of `--against REF` (exported from git) and of this tree, so drift hits both alike."""
    with tempfile.TemporaryDirectory() as baseline:
        archive = subprocess.run(["git", "archive", args.against], cwd=REPO, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", baseline], input=archive, check=True)
        rates: dict[str, list[float]] = {args.against: [], "current": []}
        for round_ in range(args.rounds):
            for label, tree in ((args.against, Path(baseline)), ("current", REPO)):
                result = run_once(args, tree)
                rates[label].append(result["rate"])
                print({"round": round_ + 1, "tree": label, **rounded(result)}, flush=True)
    medians = {label: statistics.median(values) for label, values in rates.items()}
    print({"median_rate": rounded(medians), "ratio": round(medians["current"] / medians[args.against], 2)})


def rounded(result: dict) -> dict:
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in result.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["submit", "streams", "health"])
    parser.add_argument("-n", type=int, default=None)
    parser.add_argument("-c", type=int, default=32)
    parser.add_argument("--server", choices=["granian", "uvicorn", "daphne"], default="granian")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--client", choices=["aiohttp", "wrk"], default="aiohttp")
    parser.add_argument("--seconds", type=int, default=20, help="wrk run length")
    parser.add_argument("--hold", type=float, default=20)
    parser.add_argument("--against", metavar="REF", help="git ref to compare with, run by turns with this tree")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.against:
        against(args)
    else:
        print(rounded(run_once(args, REPO)))


if __name__ == "__main__":
    main()
