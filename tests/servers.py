"""The production layout's web server for tests that need real HTTP: deploy/systemd/kernelbot-web.service's command
(granian, its flags; two workers unless told) with production settings (DEBUG off, no TLS proxy) on the test
database, as docs/operations.md runs it."""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from django.db import connection

from .conftest import REPO


def production_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The server's environment: production settings on the test database, no Redis (the ORM broker, no cluster)."""
    db = connection.settings_dict
    return {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DB_POOL", "DB_CONN_MAX_AGE")} | {
        "DJANGO_SETTINGS_MODULE": "kernelbot.settings", "DEBUG": "0", "SECRET_KEY": "server-test-" + "x" * 50,
        "ALLOWED_HOSTS": "127.0.0.1", "SECURE_SSL_REDIRECT": "0", "SECURE_COOKIES": "0", "SECURE_HSTS_SECONDS": "0",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "KERNELBOT_RUNS_DIR": str(tmp_path / "runs"), "LOG_LEVEL": "WARNING", **extra}


WEB_UNIT = REPO / "deploy" / "systemd" / "kernelbot-web.service"


def web_command(port: int) -> list[str]:
    """The web unit's ExecStart on this interpreter and `port` (its shell execs granian, with KERNELBOT_WEB_WORKERS
    workers)."""
    line = next(line for line in WEB_UNIT.read_text().splitlines() if line.startswith("ExecStart="))
    line = line.removeprefix("ExecStart=").replace("/srv/kernelbot/.venv/bin/python", sys.executable)
    return shlex.split(line.replace("--port 8000", f"--port {port}"))


class Server(str):
    """The server's base URL; `pid`: granian's main process (its workers are its children)."""

    pid: int


@contextlib.contextmanager
def granian(env: dict[str, str], log: Path, workers: int = 2) -> Iterator[Server]:
    """Serve until the block ends; yields the base URL once `/api/v1/health` answers 200."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with log.open("wb") as out:
        server = subprocess.Popen(web_command(port), cwd=REPO, env={**env, "KERNELBOT_WEB_WORKERS": str(workers)},
                                  stdout=out, stderr=subprocess.STDOUT)
    url = Server(f"http://127.0.0.1:{port}")
    url.pid = server.pid
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/api/v1/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None, log.read_text(errors="replace")[-3000:]
            time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
