"""A reservation's processes belong to something only the platform controls: every holder login (hold.py, the forced
command of its authorized_keys line) and all it starts sit in the reservation's cgroup, or without one under a keeper
that is their child subreaper; the agent ends them whole when the reservation ends, however they detached or rewrote
their environment. Tags and groups carry the installation's key: agents of other installations on the same machine
never touch them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.utils import timezone

from runners.harness import cgroups
from runners.harness.node import NodeAgent
from runners.reservations.models import DeviceHold, Reservation

from .. import factories
from ..agents import in_process_agent
from ..factories import UserFactory
from .test_node_agent import alive, login, new_key, reservation_hold, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="holders log in as the agent's account: root here")


def holder_agent(node, keys: Path) -> NodeAgent:
    agent = in_process_agent(node)
    agent.sweep_s = 0
    agent.authorized_keys = keys
    return agent


def detached(line: str, tmp_path: Path) -> int:
    """A holder's login that starts `setsid env -i sleep` (no tag, its own session, no parent but init once the login
    ends) and returns at once: the sleep's pid."""
    out = tmp_path / f"pid-{uuid.uuid4().hex}"
    login(line, f"setsid env -i sh -c 'echo $$ > {out}; exec sleep 600' >/dev/null 2>&1 </dev/null &")
    return int(wait_for(lambda: out.exists() and out.read_text().strip(), 10, "the detached process"))


def end(hold: DeviceHold) -> None:
    DeviceHold.objects.filter(pk=hold.pk).update(ended=timezone.now())
    Reservation.objects.filter(pk=hold.reservation_id).update(status="ended")


@pytest.fixture
def v2_parent(monkeypatch):
    """A cgroup v2 directory as KERNELBOT_CGROUP (this machine's v1 memory hierarchy is not used)."""
    unified = Path("/sys/fs/cgroup/unified")
    if not (unified / "cgroup.controllers").exists():
        pytest.skip("no cgroup v2 hierarchy mounted")
    path = unified / f"kernelbot-test-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    monkeypatch.setenv("KERNELBOT_CGROUP", str(path))
    monkeypatch.setattr(cgroups, "memory_parent", lambda: (_ for _ in ()).throw(cgroups.CgroupUnavailable("v2")))
    yield path
    for child in path.iterdir():
        if child.is_dir():
            cgroups.MemoryGroup(str(child), "v2", 0).remove()
    path.rmdir()


@pytest.mark.django_db
@pytest.mark.parametrize("containment", ["cgroup", "cgroup v2", "keeper"])
def test_a_holders_setsid_env_i_process_dies_when_the_reservation_ends(cpu_pool, tmp_path, containment, request):
    if containment == "cgroup v2":
        request.getfixturevalue("v2_parent")
    node = cpu_pool.nodes.get()
    holder = UserFactory()
    new_key(holder, tmp_path)
    hold = reservation_hold(node, holder)
    agent = holder_agent(node, tmp_path / "authorized_keys")
    if containment == "keeper":
        agent._holds = [None]  # no usable cgroup: the login's keeper holds the tree
    else:
        assert agent.holds is not None and agent.holds.version == ("v2" if containment == "cgroup v2" else
                                                                   agent.holds.version)
    pids = []
    try:
        agent.poll()
        (line,) = agent.authorized_keys.read_text().splitlines()
        pids = [detached(line, tmp_path), detached(line, tmp_path)]
        agent.poll()
        assert all(alive(pid) for pid in pids)  # its reservation holds them
        if containment != "keeper":
            assert set(pids) <= set(agent.holds.pids(hold.reservation_id))
        end(hold)
        agent.poll()
        wait_for(lambda: not any(alive(pid) for pid in pids), 10, "the holder's detached processes to die")
        if containment != "keeper":
            assert not os.path.exists(agent.holds.path(hold.reservation_id))
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.django_db
@pytest.mark.parametrize("containment", ["cgroup", "keeper"])
def test_agents_of_two_installations_on_one_machine_never_touch_each_others_reservations(cpu_pool, tmp_path,
                                                                                        containment):
    """Two agents on one machine, each with a live reservation of its own (another installation's, as far as the
    other knows): each ends only its own reservation's processes, tagged or not."""
    other_pool = factories.local_cpu_pool("other")
    other_pool.nodes.update(hostname="localhost-other")  # one machine, seen by two platforms under two names
    agents, holds, lines, pids = [], [], [], {}
    try:
        for i, pool in enumerate((cpu_pool, other_pool)):
            node = pool.nodes.get()
            holder = UserFactory()
            new_key(holder, tmp_path)
            holds.append(reservation_hold(node, holder))
            agents.append(holder_agent(node, tmp_path / f"authorized_keys{i}"))
            if containment == "keeper":
                agents[-1]._holds = [None]
        assert agents[0].installation != agents[1].installation
        for agent in agents:
            agent.poll()
            (line,) = agent.authorized_keys.read_text().splitlines()
            lines.append(line)
        for i, line in enumerate(lines):
            pids[i] = [login(line, "sleep 600"), detached(line, tmp_path)]
        for _ in range(2):
            for agent in agents:
                agent.poll()
        assert all(alive(pid) for group in pids.values() for pid in group), pids
        end(holds[0])
        for _ in range(2):
            for agent in agents:
                agent.poll()
        wait_for(lambda: not any(alive(pid) for pid in pids[0]), 10, "the ended reservation's processes to die")
        for agent in agents:
            agent.poll()
        assert all(alive(pid) for pid in pids[1])  # the other installation's live reservation is untouched
    finally:
        for pid in (p for group in pids.values() for p in group):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for agent in agents:
            if agent.holds is not None:
                agent.holds.end(set())


def test_a_keepers_login_exits_with_its_shells_status_while_the_keeper_holds_what_it_left(tmp_path):
    """Without a cgroup: the login ends with its shell (ssh returns), its exit status the shell's; the keeper, tagged,
    holds the detached process as its child."""
    out = tmp_path / "pid"
    env = {**os.environ, "SSH_ORIGINAL_COMMAND": f"setsid sh -c 'echo $$ > {out}; exec sleep 600' "
                                                  ">/dev/null 2>&1 </dev/null & exit 7",
           "KERNELBOT_RESERVATION": "5", "KERNELBOT_INSTALLATION": "k"}
    done = subprocess.run([sys.executable, "-I", "runners/harness/hold.py", ""], env=env, timeout=10)
    assert done.returncode == 7
    pid = int(wait_for(lambda: out.exists() and out.read_text().strip(), 10, "the detached process"))
    try:
        with open(f"/proc/{pid}/stat") as f:
            keeper = int(f.read().rsplit(")", 1)[1].split()[1])
        assert b"KERNELBOT_RESERVATION=5" in Path(f"/proc/{keeper}/environ").read_bytes()
    finally:
        os.kill(pid, signal.SIGKILL)
