"""One web worker dying takes down only itself (issue 35): granian, as deploy/systemd/kernelbot-web.service and
tests/servers.py run it (`--respawn-failed-workers`), replaces a SIGKILLed worker while the other one goes on
serving; without the flag granian stopped the whole server, refusing every connection until systemd restarted it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import signal
import time
from pathlib import Path

import httpx
import pytest
from django.db import connection

from runners.harness.node import node_token

from .conftest import RUNNER_KEY
from .servers import granian, production_env

pytestmark = pytest.mark.timeout(180)


def children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found.update(int(child) for child in (task / "children").read_text().split())
    return found


def test_a_killed_web_worker_refuses_no_connection_and_is_replaced(transactional_db, postgres, tmp_path):
    log = tmp_path / "granian.log"
    with granian(production_env(tmp_path), log) as url:
        deadline = time.monotonic() + 60
        while len(workers := children(url.pid)) != 2:
            assert time.monotonic() < deadline, f"granian's workers: {workers}"
            time.sleep(0.2)
        victim = min(workers)
        os.kill(victim, signal.SIGKILL)
        answers: list[int | str] = []
        replaced = None
        for _ in range(400):  # bounded: each request on a new connection, until the victim's successor served 20
            try:
                answers.append(httpx.get(f"{url}/api/v1/health", timeout=30).status_code)
            except httpx.TransportError as exc:  # refused or dropped
                answers.append(repr(exc))
            now = children(url.pid)
            if replaced is None and victim not in now and len(now) == 2:
                replaced = len(answers)
            if replaced is not None and len(answers) >= replaced + 20:
                break
            time.sleep(0.05)
        print(f"--- {log.name} (tail) ---\n" + log.read_text(errors="replace")[-2000:])
        assert replaced is not None, f"no worker replaced the killed one; workers now: {children(url.pid)}"
        assert answers == [200] * len(answers), [a for a in answers if a != 200]


HELD = 1100  # more than granian's default backpressure (backlog / workers = 1024 with one worker) would serve at once


def test_a_fleets_held_waits_keep_no_user_out(transactional_db, postgres, cpu_pool, tmp_path):
    """Every node agent holds one request open (nodes/wait) and one worker may hold nearly all of a fleet's: with
    granian's default backpressure, 1000 idle nodes on two workers kept users' requests queued until a wait ended, and
    in bench/fleet.py a user read went unanswered for 60 s. With the production unit's flags, a worker holding 1100
    waits still answers a user at once, while every wait is still held."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * HELD)), hard))  # the unit's LimitNOFILE
    env = production_env(tmp_path, KERNELBOT_RUNNER_KEY=RUNNER_KEY, KERNELBOT_NODE_WAIT="60")
    connection.close()
    body = json.dumps({"pool": "local", "hostname": "localhost", "free": [0], "wait": 60})
    headers = {"Authorization": f"Bearer {node_token(RUNNER_KEY, 'local', 'localhost')}",
               "Content-Type": "application/json"}

    async def scenario(url: str) -> tuple[int, int, int]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(limits=limits, timeout=90) as fleet, httpx.AsyncClient(timeout=20) as user:
            assert (await fleet.post(f"{url}/api/runner/v1/nodes/wait", content=body.replace("60}", "0}"),
                                     headers=headers)).status_code == 200  # the node is known: its waits are held
            waits = [asyncio.ensure_future(fleet.post(f"{url}/api/runner/v1/nodes/wait", content=body,
                                                      headers=headers)) for _ in range(HELD)]
            await asyncio.sleep(8)  # every wait sent and held (a wait without news ends after 60 s)
            try:
                answered = (await user.get(f"{url}/api/v1/health")).status_code
            except httpx.TimeoutException:
                answered = 0
            held = sum(not w.done() for w in waits)
            failed = sum(w.done() and (w.exception() is not None or w.result().status_code != 200) for w in waits)
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
            return answered, held, failed

    try:
        with granian(env, tmp_path / "granian.log", workers=1) as url:
            answered, held, failed = asyncio.run(scenario(url))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert (answered, failed) == (200, 0)
    assert held == HELD  # the user was answered while the fleet still held every wait
