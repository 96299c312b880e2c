"""One web worker dying takes down only itself (issue 35): granian, as deploy/systemd/kernelbot-web.service and
tests/servers.py run it (`--respawn-failed-workers`), replaces a SIGKILLed worker while the other one goes on
serving; without the flag granian stopped the whole server, refusing every connection until systemd restarted it."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

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
