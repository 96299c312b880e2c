"""docs/operations.md's production install, from an empty PostgreSQL database, with the services started from the
`ExecStart` lines of deploy/systemd/*.service (only the checkout's path, the port, the agent's directory and cgroup
and systemd's %H substituted): migrate, the first pool and GPU type, the web server, the workers and a node agent; a
submission gets its verdict on the device the agent registered from its probe. And cheaply: the units pass
`systemd-analyze verify` (systemd 252 on Debian 12 knows every key), and their ExecStart lines, run as written, do
what the comments beside them say."""

from __future__ import annotations

import configparser
import contextlib
import io
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.core.management import call_command

from runners.harness.node import node_token

from . import factories
from .conftest import REPO, require_tool, stop_groups

UNITS = REPO / "deploy" / "systemd"
VENV_PYTHON = "/srv/kernelbot/.venv/bin/python"


def unit_service(unit: str) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read(UNITS / unit)
    return parser["Service"]


def unit_environment(unit: str) -> dict[str, str]:
    """The unit's `Environment=` assignments (configparser keeps the last line of a repeated key: read them raw)."""
    found = {}
    for line in (UNITS / unit).read_text().splitlines():
        if line.startswith("Environment="):
            for item in shlex.split(line.removeprefix("Environment=")):
                key, _, value = item.partition("=")
                found[key] = value
    return found


SERVICE_GROUP = "system.slice/kernelbot-agent.service"


def service_cgroups(name: str) -> tuple[dict[str, str], list[str]]:
    """What systemd 252 makes for the agent's unit (Delegate=memory pids) on this machine, at `name` in place of
    system.slice/kernelbot-agent.service: (unit path → this test's path, the groups the agent's processes start in).
    cgroup v2 at /sys/fs/cgroup (its ExecStart moves itself to runner/), or the v1 memory and pids hierarchies (hybrid
    hosts too)."""
    paths, procs = {f"/sys/fs/cgroup/{SERVICE_GROUP}": f"/sys/fs/cgroup/{name}"}, []
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        os.makedirs(f"/sys/fs/cgroup/{name}")
        procs.append(f"/sys/fs/cgroup/{name}")
    for controller in ("memory", "pids"):
        if os.path.exists(f"/sys/fs/cgroup/{controller}/cgroup.procs"):
            os.makedirs(f"/sys/fs/cgroup/{controller}/{name}")
            paths[f"/sys/fs/cgroup/{controller}/{SERVICE_GROUP}"] = f"/sys/fs/cgroup/{controller}/{name}"
            procs.append(f"/sys/fs/cgroup/{controller}/{name}")
    return paths, procs


def remove_cgroups(paths: list[str]) -> None:
    for path in sorted(paths, key=len, reverse=True):
        for child in sorted(Path(path).glob("**/"), key=lambda p: len(str(p)), reverse=True):
            with contextlib.suppress(OSError):
                child.rmdir()


def exec_start(unit: str, env: dict[str, str], port: int = 8000, runs: str = "/var/lib/kernelbot/runs",
               paths: dict[str, str] | None = None, python: str = sys.executable) -> list[str]:
    """The unit's ExecStart as systemd runs it (${VAR} from the environment, %H the hostname), on this machine's
    paths: the interpreter, the port, the agent's directory and `paths` (unit path → this test's)."""
    service = unit_service(unit)
    assert service["WorkingDirectory"] == "/srv/kernelbot" and service["Restart"] == "always"
    line = service["ExecStart"].replace(VENV_PYTHON, python)
    line = re.sub(r"--port \d+", f"--port {port}", line).replace("/var/lib/kernelbot/runs", runs)
    for unit_path, path in (paths or {}).items():
        line = line.replace(unit_path, path)
    line = re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], line).replace("%H", socket.gethostname())
    assert "%" not in line, line  # no other specifier
    return shlex.split(line)


INSTALLED = ("kernelbot-web.service", "kernelbot-runners.service", "kernelbot-workers.service",
             "kernelbot-agent.service")


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


def test_the_units_pass_systemd_analyze_verify(tmp_path):
    """No unknown key or bad line (DelegateSubgroup= was one on systemd 252), with the checkout's interpreter."""
    require_tool("systemd-analyze")  # .ci/run installs Debian's systemd: under CI=true this never skips
    for unit in sorted(UNITS.glob("*.service")):
        (tmp_path / unit.name).write_text(unit.read_text().replace(VENV_PYTHON, sys.executable))
    done = subprocess.run(["systemd-analyze", "verify", *sorted(map(str, tmp_path.iterdir()))], capture_output=True,
                          text=True, timeout=60)
    complaints = [line for line in (done.stdout + done.stderr).splitlines() if str(tmp_path) in line]
    assert done.returncode == 0 and not complaints, done.stdout + done.stderr


@pytest.mark.django_db
def test_the_agents_exec_start_hands_its_group_to_runs_and_names_a_token_command_that_runs(tmp_path):
    """Run as written, against a stand-in for its v2 service group: it moves itself into runner/ and enables memory,
    pids and cpu for the group's children, then starts the agent with this machine's hostname; without a token the
    agent refuses and names the command that prints one, which runs."""
    group = tmp_path / "group"
    group.mkdir()
    (group / "cgroup.subtree_control").write_text("")
    env = {"PATH": os.environ["PATH"], "KERNELBOT_PUBLIC_URL": "http://127.0.0.1:9", "KERNELBOT_AGENT_POOL": "lab"}
    done = subprocess.run(exec_start("kernelbot-agent.service", env, runs=str(tmp_path / "runs"),
                                     paths={f"/sys/fs/cgroup/{SERVICE_GROUP}": str(group)}), cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert (group / "runner" / "cgroup.procs").read_text() == "0\n"  # itself, out of the group it hands on
    assert (group / "cgroup.subtree_control").read_text() == "+cpu\n"  # +memory, +pids, then +cpu (a plain file)
    (command,) = re.findall(r"`([^`]*)`", done.stderr)
    args = shlex.split(command)
    assert args[:3] == ["manage.py", "node_token", "lab"] and args[3:] == ["--hostname", socket.gethostname()]
    factories.local_cpu_pool("lab")
    out = io.StringIO()
    call_command(*args[1:], stdout=out)
    assert out.getvalue().strip() == node_token(settings.RUNNER_KEY, "lab", socket.gethostname())


@pytest.mark.parametrize("workers", ["", "5"])
@pytest.mark.parametrize(("unit", "variable"), [("kernelbot-web.service", "KERNELBOT_WEB_WORKERS"),
                                                ("kernelbot-runners.service", "KERNELBOT_RUNNER_WEB_WORKERS")])
def test_the_web_units_workers_are_one_per_core_unless_set(tmp_path, workers, unit, variable):
    python = tmp_path / "python"
    python.write_text('#!/bin/sh\necho "$@"\n')
    python.chmod(0o755)
    env = {"PATH": os.environ["PATH"], variable: workers}
    done = subprocess.run(exec_start(unit, env, python=str(python)), env=env, capture_output=True,
                          text=True, timeout=30, check=True)
    expected = workers or str(len(os.sched_getaffinity(0)))  # nproc: the cores this process may use
    assert f" --host 127.0.0.1 --port 8000 --workers {expected} " in done.stdout, done.stdout


@pytest.mark.slow(seconds=65)
def test_the_documented_production_install_runs_a_kernel(empty_database, redis_url, tmp_path):
    port, runners_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "KERNELBOT_", "DEBUG", "PYTEST"))} | {
        "SECRET_KEY": "production-install-test-" + "x" * 40, "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "SECURE_SSL_REDIRECT": "0", "DATABASE_URL": empty_database, "REDIS_URL": redis_url, "DB_POOL": "1",
        "KERNELBOT_PUBLIC_URL": f"http://127.0.0.1:{port}", "KERNELBOT_RUNNER_KEY": uuid.uuid4().hex,
        "KERNELBOT_INSTANCE": f"install-{os.getpid()}", "KERNELBOT_DATA_DIR": str(tmp_path / "data"),
        "KERNELBOT_SANDBOX": os.environ.get("KERNELBOT_SANDBOX", "auto"), "KERNELBOT_AGENT_POOL": "lab",
        "KERNELBOT_CASE_BUDGET_S": "0.5", "KERNELBOT_POOL_CHECK_INTERVAL": "0",
        "KERNELBOT_SPREAD_REFRESH_DAYS": "0"}  # the test waits for its own run alone

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
    agent_env = {k: v for k, v in env.items() if k != "KERNELBOT_RUNNER_KEY"} | {"KERNELBOT_NODE_TOKEN": node,
        "KERNELBOT_PUBLIC_URL": f"http://127.0.0.1:{runners_port}"}  # where the proxy would route /api/runner/
    unit_env = unit_environment("kernelbot-agent.service")
    assert unit_env["KERNELBOT_SANDBOX"] == "require"  # an agent set up from the docs never runs unsandboxed
    agent_env |= unit_env
    name, cgroups, procs = f"kernelbot-install-{uuid.uuid4().hex[:8]}", {}, []
    if os.geteuid() == 0:  # the unit's User=root: its cgroups as systemd makes them, on this machine's v1 or v2
        cgroups, procs = service_cgroups(name)
        agent_env["KERNELBOT_CGROUP"] = ":".join(cgroups.get(p, p) for p in unit_env["KERNELBOT_CGROUP"].split(":"))
    else:
        del agent_env["KERNELBOT_CGROUP"]

    def in_service_cgroups() -> None:
        for group in procs:
            Path(group, "cgroup.procs").write_text("0")

    services = []
    try:
        for unit in INSTALLED:
            agent = unit == "kernelbot-agent.service"
            services.append(subprocess.Popen(exec_start(unit, env, runners_port if unit == "kernelbot-runners.service"
                                                        else port, runs, cgroups if agent else None), cwd=REPO,
                                             start_new_session=True,
                                             env=agent_env if agent else env, preexec_fn=in_service_cgroups if agent
                                             else None, stdout=(tmp_path / f"{unit}.log").open("w"),
                                             stderr=subprocess.STDOUT))
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
        sandbox = json.loads(manage("shell", "-c", "import json; from runners.models import Node; "
                                    "print(json.dumps(Node.objects.get(pool__name='lab').sandbox))").splitlines()[-1])
        assert sandbox["mode"] == "require" and sandbox["backend"] == "bubblewrap", sandbox
        if cgroups:  # runs' memory and process limits in the unit's delegated groups, v2 or v1
            assert sandbox["memory_cgroup"] in (f"v2 /sys/fs/cgroup/{name}", f"v1 /sys/fs/cgroup/memory/{name}")
            assert sandbox["process_limit"] == "pids cgroup", sandbox
    finally:
        stop_groups(*services, grace=30)  # as systemd stops them (the units' TimeoutStopSec)
        remove_cgroups(list(cgroups.values()))
        for unit in INSTALLED:
            print(f"--- {unit} ---\n" + (tmp_path / f"{unit}.log").read_text(errors="replace")[-2000:])
