"""Node agents for tests: the real agent (`runners.harness.node.NodeAgent`) driven in this process, its HTTP calls
routed through Django's test client to the real runner API (same views, same tokens, same database transaction as
the test), and a real agent process against a live server."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from urllib.parse import urlsplit

from django.conf import settings
from django.test import Client

from runners.harness.agent import Refused
from runners.harness.node import NodeAgent, node_token
from runners.models import GpuPool, Node

REPO = settings.BASE_DIR


def client_transport(method: str, url: str, data: bytes | None, headers: dict[str, str]) -> tuple[int, bytes]:
    parts = urlsplit(url)
    path = f"{parts.path}?{parts.query}" if parts.query else parts.path
    response = Client().generic(method, path, data or b"", content_type=headers.get("Content-Type", ""),
                                headers={"Authorization": headers["Authorization"]})
    return response.status_code, response.content


@functools.cache
def machine_probe() -> dict:
    """This machine's real probe, taken once per test session (it imports torch)."""
    done = subprocess.run([sys.executable, "-m", "runners.harness.probe"], cwd=REPO, capture_output=True, text=True,
                          check=True, timeout=300)
    return json.loads(done.stdout)


def in_process_agent(node: Node, report: dict | None = None, *, python: str = "") -> NodeAgent:
    """The node's agent calling the runner API through the test client, registered with `report` (default: this
    machine's probe) unless the node's agent is live already (then it goes on with the devices registered)."""
    agent = NodeAgent("http://testserver", node.pool.name, node.hostname,
                      node_token(settings.RUNNER_KEY, node.pool.name, node.hostname),
                      python=python or settings.HARNESS_PYTHON or sys.executable, workroot=settings.RUNS_DIR,
                      transport=client_transport)
    settings.RUNS_DIR.mkdir(parents=True, exist_ok=True)
    node.refresh_from_db()
    if report is None and node.agent_live():
        agent.devices = list(node.gpus.filter(enabled=True).values_list("index", flat=True))
    else:
        agent.register(report or machine_probe())
    return agent


def drain(pool: GpuPool) -> int:
    """Every node agent of `pool` takes and runs, in this thread, the runs waiting for it; how many ran. A node
    whose registration the platform refuses runs nothing (a real agent would keep asking)."""
    done = 0
    while True:
        ran = 0
        for node in pool.nodes.filter(enabled=True):
            try:
                ran += in_process_agent(node).drain()
            except Refused:
                continue
        if not ran:
            return done
        done += ran


def drain_local_pools() -> int:
    return sum(drain(pool) for pool in GpuPool.objects.filter(backend="local", enabled=True))


def start_agent(platform_url: str, pool: str, hostname: str, *, env: dict | None = None, args: tuple[str, ...] = (),
                **popen) -> subprocess.Popen:
    """A real node agent process (`python -m runners.harness.node`) against a live platform."""
    return subprocess.Popen(
        [sys.executable, "-m", "runners.harness.node", "--platform", platform_url, "--pool", pool,
         "--hostname", hostname, "--workdir", str(settings.RUNS_DIR), "--poll", "0.2", *args],
        cwd=REPO, env={**os.environ, "KERNELBOT_RUNNER_KEY": settings.RUNNER_KEY, **(env or {})},
        start_new_session=True, **popen)
