"""Rank-change fan-out: one board event reaches N open websocket clients through daphne + channels-redis.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/kernelbot_webbench REDIS_URL=redis://127.0.0.1:6379/0 \\
        python bench/fanout.py [--clients 1000 --events 20]

Runs after bench/web.py (it uses that board). Daphne runs as a subprocess with the production settings;
the bench process plays the worker: it publishes `leaderboard.ranks` on the Redis layer exactly as
`events.board_changed` does after a rank recompute, and every client timestamps the delta it receives."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.update({"DEBUG": "0", "SECRET_KEY": "bench-only", "ALLOWED_HOSTS": "127.0.0.1",
                   "SECURE_SSL_REDIRECT": "0", "DJANGO_SETTINGS_MODULE": "kernelbot.settings", "LOG_LEVEL": "WARNING"})

import django  # noqa: E402

django.setup()
import websockets  # noqa: E402
from asgiref.sync import sync_to_async  # noqa: E402
from django.conf import settings  # noqa: E402

from leaderboards import events  # noqa: E402
from leaderboards.models import Leaderboard  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def client(url: str, origin: str, ready: asyncio.Semaphore, arrivals: dict[int, list[float]],
                 connected: list[int], stop: asyncio.Event) -> None:
    async with ready:
        ws = await websockets.connect(url, origin=origin, open_timeout=60, max_size=None)
        json.loads(await ws.recv())  # the snapshot
        connected.append(1)
    async with ws:
        while not stop.is_set():
            try:
                msg = json.loads(await asyncio.wait_for(ws.recv(), timeout=0.5))
            except TimeoutError:
                continue
            if msg.get("type") == "delta":
                arrivals.setdefault(msg["version"], []).append(time.perf_counter())


async def main(clients: int, n_events: int) -> None:
    if not settings.REDIS_URL:
        sys.exit("set REDIS_URL (this measures the channels-redis layer)")
    board = await sync_to_async(Leaderboard.objects.get)(name="bench-vectoradd")
    gpu = await sync_to_async(lambda: board.gpu_types.get())()
    port = free_port()
    daphne = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                               "kernelbot.asgi:application"], cwd=ROOT, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                await asyncio.sleep(0.2)
        url, origin = f"ws://127.0.0.1:{port}/ws/leaderboard/{board.pk}/{gpu.pk}/", f"http://127.0.0.1:{port}"
        arrivals: dict[int, list[float]] = {}
        connected: list[int] = []
        stop = asyncio.Event()
        t0 = time.perf_counter()
        gate = asyncio.Semaphore(50)  # connect 50 at a time
        tasks = [asyncio.create_task(client(url, origin, gate, arrivals, connected, stop)) for _ in range(clients)]
        while len(connected) < clients:
            await asyncio.sleep(0.1)
            if time.perf_counter() - t0 > 300:
                sys.exit(f"only {len(connected)} clients connected")
        print(f"{clients} clients connected and got snapshots in {time.perf_counter() - t0:.1f}s")
        await asyncio.sleep(1)
        sent: dict[int, float] = {}
        entry = [{"user": 1, "submission": 1, "score": 1e-6, "rank": 1}]
        for i in range(n_events):
            version = 10_000 + i
            sent[version] = time.perf_counter()
            await sync_to_async(events.board_changed)(board.pk, gpu.pk, version, entry)
            await asyncio.sleep(1.5)
        await asyncio.sleep(2)
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        latencies = sorted(1000 * (t - sent[v]) for v, times in arrivals.items() for t in times)
        delivered = len(latencies) / (clients * n_events)
        p = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]  # noqa: E731
        print(f"{n_events} rank changes x {clients} clients: delivered {100 * delivered:.1f} %, "
              f"p50 {statistics.median(latencies):.0f} ms, p99 {p(0.99):.0f} ms, max {latencies[-1]:.0f} ms")
    finally:
        os.killpg(daphne.pid, signal.SIGTERM)
        daphne.wait(timeout=15)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--events", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(main(args.clients, args.events))
