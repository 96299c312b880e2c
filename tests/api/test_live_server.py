"""Against a real server on 127.0.0.1 (granian with two workers, as docs/operations.md runs it in production, and
a django-q2 cluster) sharing the test database: the kernelbot CLI logs in and submits a demo kernel that gets
ranked and shows up on the board's websocket; popcorn's SSE route streams to a final result; many progress
streams stay open at once. (The browser test runs daphne; `./dev serve` runs granian, as production does.)"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time

import aiohttp
import httpx
import pytest
from django.conf import settings

from leaderboards.access.actions import do_create_token
from leaderboards.models import BoardEntry

from ..conftest import REPO
from ..factories import LeaderboardFactory, UserFactory, local_cpu_pool, problem_from
from .conftest import multipart

SOLUTIONS = REPO / "problems" / "demo" / "vectoradd_py" / "solutions"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(transactional_db, postgres, demo_task, tmp_path):
    db = settings.DATABASES["default"]
    env = {**os.environ, "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
           "KERNELBOT_REL_CI": "0.05", "KERNELBOT_CASE_BUDGET_S": "1", "KERNELBOT_MAX_SAMPLES": "100",
           "KERNELBOT_RUNS_DIR": str(tmp_path / "runs"), "KERNELBOT_QUOTA_TEST": "0", "KERNELBOT_QUOTA_RANKED": "0",
           "KERNELBOT_LIVE_OUTBOX_POLL": "0.25", "Q_WORKERS": "1"}
    env.pop("REDIS_URL", None)  # ORM broker in the test database: isolated from any other cluster on this Redis
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "granian", "--interface", "asginl", "--host", "127.0.0.1",
                               "--port", str(port), "--workers", "2", "kernelbot.asgi:application"], cwd=REPO, env=env),
             subprocess.Popen([sys.executable, "manage.py", "qcluster"], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    base = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            if httpx.get(f"{base}/api/v1/health").status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    pool = local_cpu_pool()
    procs.append(subprocess.Popen(  # the machine's node agent, as its systemd unit starts it
        [sys.executable, "-m", "runners.harness.node", "--platform", base, "--pool", pool.name, "--hostname",
         "localhost", "--workdir", str(tmp_path / "runs")], cwd=REPO, env=env))
    board = LeaderboardFactory(name="vectoradd-live", problem=problem_from(demo_task), gpu_types=[pool.cpu])
    user = UserFactory(username="cli-user")
    yield base, board, user, do_create_token(user)[1]
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


def cli(base: str, config, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KERNELBOT_CONFIG": str(config), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "kernelbot.cli.main", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_cli_logs_in_submits_and_sees_its_ranked_result(server, tmp_path):
    base, board, user, token = server
    config = tmp_path / "config.json"
    out = cli(base, config, "login", "--url", base, "--token", token)
    assert out.returncode == 0 and "as cli-user" in out.stdout, out.stdout + out.stderr
    assert json.loads(config.read_text())["token"] == token
    assert board.name in cli(base, config, "leaderboards").stdout
    source = tmp_path / "fast.py"
    source.write_text(f"#!POPCORN leaderboard {board.name}\n#!POPCORN gpu CPU\n" + (SOLUTIONS / "fast.py").read_text())
    out = cli(base, config, "submit", str(source), "--mode", "leaderboard")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "succeeded" in out.stdout and re.search(r"\d+\.\d+ (µs|ms)", out.stdout), out.stdout
    entry = BoardEntry.objects.with_rank().get(leaderboard=board, user=user)
    assert entry.rank == 1 and entry.score > 0
    listed = cli(base, config, "submissions", "list").stdout
    assert "fast.py" in listed and "succeeded" in listed
    assert f"#{entry.submission_id}" in cli(base, config, "submissions", "show", str(entry.submission_id)).stdout
    snapshot = asyncio.run(first_websocket_message(base, f"/ws/leaderboard/{board.pk}/{entry.gpu_type_id}/"))
    assert snapshot["type"] == "snapshot" and snapshot["entries"][0]["submission"] == entry.submission_id
    wrong = tmp_path / "wrong.py"
    wrong.write_text((SOLUTIONS / "wrong.py").read_text())
    out = cli(base, config, "submit", str(wrong), "-l", board.name, "-g", "cpu", "-m", "test")
    assert out.returncode == 2 and "failed" in out.stdout


async def first_websocket_message(base: str, path: str) -> dict:
    """As a browser on the site connects: the origin header is checked against ALLOWED_HOSTS."""
    async with aiohttp.ClientSession() as session, \
            session.ws_connect(base.replace("http", "ws", 1) + path, origin=base) as ws:
        return await ws.receive_json(timeout=30)


def test_popcorn_sse_route_streams_status_then_one_result(server):
    base, board, _, token = server
    body, content_type = multipart((SOLUTIONS / "correct.py").read_bytes(), "correct.py")
    events = []
    with httpx.stream("POST", f"{base}/popcorn/{board.name}/CPU/test", content=body, timeout=300,
                      headers={"X-Popcorn-Cli-Id": token, "Content-Type": content_type}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        buffer = ""
        for chunk in response.iter_text():
            assert "\r" not in chunk
            buffer += chunk
            while "\n\n" in buffer:
                message, buffer = buffer.split("\n\n", 1)
                lines = dict(line.split(":", 1) for line in message.split("\n") if ":" in line)
                events.append((lines["event"].strip(), json.loads(lines["data"])))
    assert events[0] == ("status", {"status": "processing", "elapsed_time": 0.0})
    assert [e for e, _ in events].count("result") == 1 and events[-1][0] == "result"
    result = events[-1][1]
    assert result["status"] == "success" and result["results"][0]["runs"]["test"]["run"]["passed"] is True
    assert isinstance(result["reports"][0], str) and "pass" in result["reports"][0]


def test_popcorn_polled_flow_and_many_open_progress_streams(server):
    base, board, _, token = server
    headers = {"X-Popcorn-Cli-Id": token}
    body, content_type = multipart((SOLUTIONS / "correct.py").read_bytes())
    response = httpx.post(f"{base}/popcorn/submission/{board.name}/CPU/test", content=body,
                          headers={**headers, "Content-Type": content_type})
    sub_id = response.json()["details"]["id"]

    async def open_streams(n: int) -> list[str]:
        async with httpx.AsyncClient(base_url=base, timeout=60, limits=httpx.Limits(max_connections=None)) as c:
            async def first_event(_):
                async with c.stream("GET", f"/api/v1/submissions/{sub_id}/events",
                                    headers={"Authorization": f"Bearer {token}"}) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("event:"):
                            return line
            return await asyncio.gather(*map(first_event, range(n)))

    assert all(e in ("event: submission", "event: done") for e in asyncio.run(open_streams(50)))
    for _ in range(120):
        detail = httpx.get(f"{base}/popcorn/user/submissions/{sub_id}", headers=headers).json()
        if detail["done"] or detail["job"]["status"] in ("failed", "timed_out", "hacked"):
            break
        time.sleep(1)
    assert detail["done"] and detail["job"]["status"] == "succeeded" and detail["runs"][0]["passed"]
