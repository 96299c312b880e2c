"""API throughput and open streams, against a real server process on 127.0.0.1 and PostgreSQL.

    python bench/api.py submit  [-n 3000] [-c 32] [--server daphne|uvicorn] [--workers 1]
    python bench/api.py streams [-n 500] [--hold 20]

Creates (or resets) the database `kernelbot_bench` on $BENCH_PG (default postgres://postgres@127.0.0.1:5432),
migrates it, loads the demo, creates 50 users with tokens, and starts the server with unlimited quotas and
the django-q2 broker on Redis db 5 (no worker runs: `submit` measures accepted-and-queued).
`submit`: popcorn-cli's exact `POST /popcorn/submission/<lb>/CPU/test` (raw multipart) from an aiohttp
client with `-c` requests in flight; every answer must be 200 with `status: accepted`.
`streams`: one queued submission, `-n` concurrent `GET /api/v1/submissions/<id>/events` held open for
`--hold` seconds; each must deliver its first event and stay open without error."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
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
            "KERNELBOT_QUOTA_TEST": "0", "KERNELBOT_QUOTA_RANKED": "0", "DJANGO_SETTINGS_MODULE": "kernelbot.settings"}


def prepare() -> list[str]:
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
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=server_env(), check=True,
                         capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.startswith("kb_")]


def start_server(kind: str, workers: int) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if kind == "uvicorn":
        cmd = [sys.executable, "-m", "uvicorn", "kernelbot.asgi:application", "--port", str(port), "--workers",
               str(workers), "--no-access-log", "--log-level", "warning"]
    else:
        cmd = [sys.executable, "-m", "daphne", "-p", str(port), "--verbosity", "0", "kernelbot.asgi:application"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=server_env())
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["submit", "streams"])
    parser.add_argument("-n", type=int, default=None)
    parser.add_argument("-c", type=int, default=32)
    parser.add_argument("--server", choices=["daphne", "uvicorn"], default="daphne")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--hold", type=float, default=20)
    args = parser.parse_args()
    tokens = prepare()
    proc, base = start_server(args.server, args.workers)
    try:
        if args.what == "submit":
            result = asyncio.run(submit(base, tokens, args.n or 3000, args.c))
        else:
            result = asyncio.run(streams(base, tokens[0], args.n or 500, args.hold))
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    print({"server": f"{args.server} x{args.workers}", **{k: round(v, 2) if isinstance(v, float) else v
                                                          for k, v in result.items()}})


if __name__ == "__main__":
    main()
