"""docs/operations.md's production install, from an empty PostgreSQL database, with the services started from the
`ExecStart` lines of deploy/systemd/*.service (only the checkout's path, the port and the agent's directory
substituted): migrate, the first pool and GPU type, the web server, the workers and a node agent; a submission
gets its verdict on the device the agent registered from its probe."""

from __future__ import annotations

import configparser
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid

import psycopg
import pytest
from django.conf import settings

from .conftest import REPO, reap_group

UNITS = REPO / "deploy" / "systemd"
pytestmark = pytest.mark.slow


def exec_start(unit: str, env: dict[str, str], port: int, runs: str) -> list[str]:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read(UNITS / unit)
    service = parser["Service"]
    assert service["WorkingDirectory"] == "/srv/kernelbot" and service["Restart"] == "always"
    line = service["ExecStart"].replace("/srv/kernelbot/.venv/bin/python", sys.executable)
    line = line.replace("--port 8000", f"--port {port}").replace("/var/lib/kernelbot/runs", runs)
    line = re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], line)
    return shlex.split(line)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def empty_database(postgres):
    db = settings.DATABASES["default"]
    name = f"kb_install_{uuid.uuid4().hex[:8]}"
    admin = f"host={db['HOST'] or '127.0.0.1'} port={db['PORT'] or 5432} user={db['USER']} dbname=postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{name}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_documented_production_install_runs_a_kernel(empty_database, redis_url, tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "KERNELBOT_", "DEBUG", "PYTEST"))} | {
        "SECRET_KEY": "production-install-test-" + "x" * 40, "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "SECURE_SSL_REDIRECT": "0", "DATABASE_URL": empty_database, "REDIS_URL": redis_url, "DB_POOL": "1",
        "KERNELBOT_PUBLIC_URL": f"http://127.0.0.1:{port}", "KERNELBOT_RUNNER_KEY": uuid.uuid4().hex,
        "KERNELBOT_INSTANCE": f"install-{os.getpid()}", "KERNELBOT_DATA_DIR": str(tmp_path / "data"),
        "KERNELBOT_SANDBOX": os.environ.get("KERNELBOT_SANDBOX", "auto"), "KERNELBOT_AGENT_POOL": "lab",
        "KERNELBOT_CASE_BUDGET_S": "0.5", "KERNELBOT_POOL_CHECK_INTERVAL": "0"}

    def manage(*args: str) -> str:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    manage("migrate")
    assert "Created superuser 'admin'" in manage("ensure_admin")
    assert "pool lab created" in manage("add_pool", "lab", "--gpu-type", "CPU")
    runs = str(tmp_path / "runs")
    os.makedirs(runs)
    # the agent's machine holds its node's token only, never the platform's runner key
    node = manage("node_token", "lab", "--hostname", socket.gethostname()).strip()
    agent_env = {k: v for k, v in env.items() if k != "KERNELBOT_RUNNER_KEY"} | {"KERNELBOT_NODE_TOKEN": node}
    services = [subprocess.Popen(exec_start(unit, env, port, runs), cwd=REPO, start_new_session=True,
                                 env=agent_env if unit == "kernelbot-agent.service" else env,
                                 stdout=(tmp_path / f"{unit}.log").open("w"), stderr=subprocess.STDOUT)
                for unit in ("kernelbot-web.service", "kernelbot-workers.service", "kernelbot-agent.service")]
    try:
        agent_log = tmp_path / "kernelbot-agent.service.log"
        deadline = time.monotonic() + 180  # until its agent registered them, the pool has no device (a 503 to submit)
        while "in pool lab: devices [0]" not in agent_log.read_text():
            assert time.monotonic() < deadline and all(s.poll() is None for s in services), agent_log.read_text()
            time.sleep(0.5)
        manage("import_problems", str(REPO / "problems" / "demo" / "vectoradd_py"), "--leaderboard", "vectoradd",
               "--gpu", "CPU")
        out = manage("submit", "--user", "alice", "--create-user", "--leaderboard", "vectoradd", "--gpu", "CPU",
                     "--mode", "test", "--wait", "--timeout", "240",
                     str(REPO / "problems" / "demo" / "vectoradd_py" / "solutions" / "correct.py"))
        assert "succeeded (pass)" in out, out
        nodes = manage("shell", "-c", "from runners.models import Gpu; print([(g.node.hostname, g.index, "
                       "g.gpu_type.name, g.device_name[:4]) for g in Gpu.objects.filter(node__pool__name='lab')])")
        assert f"('{socket.gethostname()}', 0, 'CPU', 'CPU:')" in nodes  # registered by the agent from its probe
    finally:
        for service in services:
            os.killpg(service.pid, signal.SIGTERM)
        for service in services:
            try:
                service.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(service.pid, signal.SIGKILL)
            reap_group(service.pid)
        for unit in ("kernelbot-web.service", "kernelbot-workers.service", "kernelbot-agent.service"):
            print(f"--- {unit} ---\n" + (tmp_path / f"{unit}.log").read_text(errors="replace")[-2000:])
