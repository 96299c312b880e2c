"""Node agents: the only thing that runs kernels on a machine of a local pool. They register the devices their probe
finds, claim runs for free devices through the runner API, beat them, and are how a run whose machine died is
retried. The in-process agent (tests/agents.py) is the real agent code over the real views; the last tests start
real agent processes against a live server."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from leaderboards import lifecycle
from leaderboards.actions import check_submission, do_submit
from leaderboards.models import Run, RunStatus, SubmissionMode
from runners.actions import agentless_nodes
from runners.harness.node import node_token
from runners.models import Gpu, GpuPool, GpuType, Node
from runners.reservations import keys
from runners.reservations.models import DeviceHold, HoldKind, Reservation
from taskspec.loader import load_task

from .. import factories
from ..agents import drain, in_process_agent, machine_probe, start_agent
from ..conftest import REPO, RUNNER_KEY, reap_group
from ..factories import UserFactory

CODE = (REPO / "problems" / "demo" / "vectoradd_py" / "solutions" / "correct.py").read_bytes()


def submit(leaderboard, user=None, mode=SubmissionMode.TEST, gpu="CPU", code=CODE):
    user = user or UserFactory()
    return do_submit(user, check_submission(user, leaderboard.name, [gpu], mode, "k.py", code))


def dispatch_all() -> None:
    for run_id in Run.objects.filter(status=RunStatus.QUEUED).values_list("pk", flat=True):
        lifecycle.dispatch_run(run_id)


def node_call(route: str, body: dict, token: str | None = None):
    token = token if token is not None else node_token(RUNNER_KEY, body.get("pool", ""),
                                                       body.get("hostname", ""))
    return Client().post(f"/api/runner/v1/nodes/{route}", json.dumps(body), content_type="application/json",
                         headers={"Authorization": f"Bearer {token}"})


@pytest.mark.django_db
def test_a_run_waits_dispatched_until_an_agent_claims_it_and_then_runs_through_the_runner_api(leaderboard, cpu_pool):
    submission = submit(leaderboard)
    dispatch_all()
    run = submission.runs.get()
    run.refresh_from_db()
    assert run.status == RunStatus.DISPATCHED  # no worker ran it: it waits for the pool's agents
    assert drain(cpu_pool) == 1
    run.refresh_from_db()
    assert (run.status, run.verdict) == (RunStatus.SUCCEEDED, "pass"), run.error
    attempt = run.attempts.get()
    assert attempt.external_id == f"node:{cpu_pool.nodes.get().pk}:0"
    hold = DeviceHold.objects.get(run_id=run.pk)
    assert hold.ended is not None  # the device is free again once the result is in


@pytest.mark.django_db
def test_registration_comes_from_the_probe_and_a_made_up_node_gets_no_run(leaderboard, cpu_pool):
    phantom = Node.objects.create(pool=cpu_pool, hostname="gpu-node-7")
    Gpu.objects.create(node=phantom, gpu_type=cpu_pool.cpu, index=0)
    extra = Gpu.objects.create(node=cpu_pool.nodes.get(hostname="localhost"), gpu_type=cpu_pool.cpu, index=1)
    agent = in_process_agent(cpu_pool.nodes.get(hostname="localhost"), machine_probe())
    assert agent.devices == [0]  # a CPU machine is one device, whatever rows were typed in
    extra.refresh_from_db()
    assert not extra.enabled
    submit(leaderboard)
    dispatch_all()
    assert agent.drain() == 1
    assert not DeviceHold.objects.filter(gpu__node=phantom).exists()
    assert set(Run.objects.values_list("status", flat=True)) == {RunStatus.SUCCEEDED}
    assert agentless_nodes(cpu_pool) == ["gpu-node-7"]
    staff = UserFactory(is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(staff)
    page = client.get(reverse("admin:runners_gpupool_change", args=[cpu_pool.pk])).content.decode()
    assert "no agent on gpu-node-7" in page


@pytest.mark.django_db
def test_one_machine_serves_one_pool_and_bad_calls_get_precise_refusals(cpu_pool):
    other = GpuPool.objects.create(name="other")
    in_process_agent(cpu_pool.nodes.get())
    report = {"pool": "other", "hostname": "localhost", "probe": machine_probe()}
    refused = node_call("register", report)
    assert refused.status_code == 409 and "already belongs to pool local" in refused.json()["detail"]
    assert not other.nodes.exists()
    assert node_call("register", report, token="0" * 64).status_code == 403
    assert node_call("poll", {"pool": "local", "hostname": "localhost", "free": ["x"]}).status_code == 400
    assert node_call("poll", {"pool": "local", "hostname": "nowhere", "free": [0]}).status_code == 404
    assert node_call("poll", {"pool": "local\x00", "hostname": "localhost"}).status_code == 400
    assert node_call("register", {"pool": "local", "hostname": "localhost", "probe": []}).status_code == 400
    gpu_pool = GpuPool.objects.create(name="h100s")
    GpuType.objects.create(name="H100")
    answer = node_call("register", {"pool": "h100s", "hostname": "cpu-box", "probe": {**machine_probe(),
                                    "devices": [{"index": 0, "name": "NVIDIA A10", "vendor": "nvidia"}]}})
    assert answer.status_code == 409 and "no GPU type matches device #0 (NVIDIA A10)" in answer.json()["detail"]
    assert not gpu_pool.nodes.filter(gpus__isnull=False).exists()


@pytest.mark.django_db
def test_a_restarted_agent_gets_its_dead_predecessors_runs_retried_at_once(leaderboard, cpu_pool):
    agent = in_process_agent(cpu_pool.nodes.get())
    submit(leaderboard)
    dispatch_all()
    claims = agent._call("poll", {"free": [0]})["claims"]  # claimed, then the agent "dies"
    assert len(claims) == 1
    run = Run.objects.get()
    assert run.status == RunStatus.RUNNING
    answer = in_process_agent(cpu_pool.nodes.get(), machine_probe())  # the new agent registers holding nothing
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.infra_failures == 1
    assert "restarted" in run.attempts.get().reason
    assert answer.devices == [0]
    assert DeviceHold.objects.get(run_id=run.pk).ended is not None


@pytest.mark.django_db
def test_a_retried_run_keeps_its_place_ahead_of_the_backlog_queued_meanwhile(leaderboard, cpu_pool):
    agent = in_process_agent(cpu_pool.nodes.get())
    first = submit(leaderboard).runs.get()
    dispatch_all()
    assert [c["run"] for c in agent._call("poll", {"free": [0]})["claims"]] == [first.pk]  # then the agent dies
    backlog = [submit(leaderboard).runs.get().pk for _ in range(3)]
    dispatch_all()
    agent = in_process_agent(cpu_pool.nodes.get(), machine_probe())  # its successor: the run is retried
    first.refresh_from_db()
    assert first.status == RunStatus.QUEUED and first.infra_failures == 1
    assert first.queued_at > Run.objects.get(pk=backlog[-1]).queued_at  # queued again after the backlog
    dispatch_all()
    claimed = [c["run"] for c in agent._call("poll", {"free": [0]})["claims"]]
    assert claimed == [first.pk]  # yet it runs first: its place is its first queued time


@pytest.mark.django_db
def test_a_silent_agents_run_is_retried_at_its_deadline_the_agent_deadline_until_its_job_is_fetched(
        leaderboard, cpu_pool, settings):
    """A claim's job fetch that the web tier is slow to serve (a burst: fetches queued 10 s and more) is not the
    agent's fault: until its job is fetched the claim holds for the agent deadline, its device with it; from the
    fetch on, its heartbeats keep it (RUN_HEARTBEAT_DEADLINE)."""
    agent = in_process_agent(cpu_pool.nodes.get())
    first, second = submit(leaderboard), submit(leaderboard)
    dispatch_all()
    assert len(agent._call("poll", {"free": [0]})["claims"]) == 1
    run = Run.objects.get(status=RunStatus.RUNNING)
    fetch_by = timezone.now() + timedelta(seconds=settings.AGENT_DEADLINE)
    assert fetch_by - timedelta(seconds=5) <= run.status_deadline <= fetch_by
    assert DeviceHold.objects.get(run_id=run.pk).lease_until >= run.status_deadline - timedelta(seconds=1)
    assert lifecycle.do_reap_overdue_runs(now=run.status_deadline - timedelta(seconds=1)) == 0
    assert lifecycle.do_reap_overdue_runs(now=run.status_deadline + timedelta(seconds=1)) == 1
    run.refresh_from_db()
    assert run.status in (RunStatus.QUEUED, RunStatus.DISPATCHED) and run.infra_failures == 1
    other = (second if run.submission_id == first.pk else first).runs.get()
    claim = agent._call("poll", {"free": [0]})["claims"][0]
    assert claim["run"] in (run.pk, other.pk)
    assert lifecycle.do_mark_running(claim["run"], claim["attempt"])  # its job fetched: heartbeats keep it now
    fetched = Run.objects.get(pk=claim["run"])
    assert fetched.status_deadline <= timezone.now() + timedelta(seconds=settings.RUN_HEARTBEAT_DEADLINE)
    assert DeviceHold.objects.get(run_id=fetched.pk, ended__isnull=True).lease_until <= fetched.status_deadline + \
        timedelta(seconds=1)


@pytest.mark.django_db
def test_a_run_dispatched_to_a_local_pool_waits_its_turn_while_an_agent_serves_it(leaderboard, cpu_pool, settings):
    in_process_agent(cpu_pool.nodes.get())
    submit(leaderboard)
    dispatch_all()
    run = Run.objects.get()
    Node.objects.update(agent_seen_at=timezone.now() + timedelta(hours=1))  # its agent stays live meanwhile
    assert lifecycle.do_reap_overdue_runs(now=run.status_deadline + timedelta(seconds=1)) == 0
    run.refresh_from_db()
    assert run.status == RunStatus.DISPATCHED and run.infra_failures == 0  # waiting is not a failure


@pytest.fixture
def live_pool(runner_platform, transactional_db):
    return factories.local_cpu_pool()


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := predicate():
            return found
        lifecycle.do_reap_overdue_runs()  # the supervisor's tick
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}: {list(Run.objects.values_list('status', 'error'))}")


@pytest.mark.slow
def test_a_real_agent_runs_kernels_and_a_killed_one_gets_its_run_retried_within_seconds(live_pool, runner_platform,
                                                                                       settings):
    task = load_task(REPO / "problems" / "demo" / "vectoradd_py")
    leaderboard = factories.LeaderboardFactory(problem=factories.problem_from(task), gpu_types=[live_pool.cpu])
    agent = start_agent(runner_platform.url, live_pool.name, "localhost")
    try:
        wait_for(lambda: Node.objects.filter(agent_seen_at__isnull=False).exists(), 120, "the agent's registration")
        submit(leaderboard)
        dispatch_all()
        wait_for(lambda: Run.objects.filter(status=RunStatus.SUCCEEDED).exists(), 120, "the first verdict")
        # warm: the next run's parent is a spare forked from the agent's template, its sandboxed child already started
        second = submit(leaderboard).runs.get()
        dispatch_all()
        wait_for(lambda: Run.objects.filter(pk=second.pk, status=RunStatus.SUCCEEDED).exists(), 60, "the second one")
        second.refresh_from_db()
        assert (second.verdict, second.result["runner_timing"]["parent"], second.result["child_start"]) == (
            "pass", "spare", "prestarted")
        # a slow kernel: the agent is killed while it runs it
        slow = CODE + b"\nimport time as _t\n_orig = custom_kernel\ndef custom_kernel(data):\n    _t.sleep(30)\n" \
                      b"    return _orig(data)\n"
        run = submit(leaderboard, code=slow).runs.get()
        dispatch_all()
        wait_for(lambda: Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING, started_at__gt=F("dispatched_at"))
                 .exists(), 60, "the slow run's job fetched")  # a claim not fetched yet holds for the agent deadline
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait()
        killed = time.monotonic()
        wait_for(lambda: Run.objects.filter(pk=run.pk, infra_failures=1).exists(), 30, "the retry")
        assert time.monotonic() - killed <= settings.RUN_HEARTBEAT_DEADLINE + 5
        assert not DeviceHold.objects.filter(run_id=run.pk, ended__isnull=True).exists()
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
        reap_group(agent.pid)


@pytest.mark.django_db
def test_a_multi_gpu_run_is_not_starved_by_younger_single_gpu_runs(demo_task):
    """The oldest run that fits the node once enough devices free waits for them: a younger single-GPU run does not
    take a device it freed. A run the node can never hold (more devices than it has) blocks nobody."""
    h100 = GpuType.objects.create(name="H100", vendor="nvidia")
    pool = GpuPool.objects.create(name="lab")
    node = Node.objects.create(pool=pool, hostname="gpu-a", agent_seen_at=timezone.now())
    for index in (0, 1):
        Gpu.objects.create(node=node, gpu_type=h100, index=index)

    def board(world_size: int):
        problem = factories.problem_from(demo_task.model_copy(update={"name": f"{demo_task.name}-x{world_size}"}))
        if world_size > 1:
            problem.definition = {**problem.definition, "multi_gpu": True, "tests": [
                {**case, "world_size": world_size} for case in problem.definition["tests"]]}
            problem.save()
        return factories.LeaderboardFactory(problem=problem, gpu_types=[h100])

    never = submit(board(4), gpu="H100").runs.get()  # oldest: four devices, this node has two
    pair = submit(board(2), gpu="H100").runs.get()
    single = board(1)
    singles = [submit(single, gpu="H100").runs.get() for _ in range(2)]
    dispatch_all()
    assert lifecycle.do_claim_runs(node, [1]) == []  # the pair is next on this node: device 1 waits for device 0
    assert set(Run.objects.filter(pk__in=[s.pk for s in singles]).values_list("status", flat=True)) == {
        RunStatus.DISPATCHED}
    (claim,) = lifecycle.do_claim_runs(node, [0, 1])
    assert (claim["run"], claim["devices"]) == (pair.pk, [0, 1])
    Run.objects.get(pk=pair.pk).update_status(RunStatus.SUCCEEDED)  # its devices are free again
    (claim,) = lifecycle.do_claim_runs(node, [1])  # the singles go on; the four-device run never held them up
    assert claim["run"] == singles[0].pk
    assert Run.objects.get(pk=never.pk).status == RunStatus.DISPATCHED


FAKE_NVIDIA_SMI = """#!/bin/sh
# nvidia-smi at its edge: one GPU (index 0), and the compute processes listed in $1's directory's pids file
case "$1" in
  --query-gpu=*) echo "0, 00000000:3B:00.0" ;;
  --query-compute-apps=*) while read -r pid; do echo "$pid, 00000000:3B:00.0"; done < "$(dirname "$0")/pids" ;;
esac
"""


@pytest.mark.django_db
def test_a_process_left_on_a_device_nothing_holds_is_killed_but_a_reservations_is_not(cpu_pool, tmp_path,
                                                                                       monkeypatch):
    """Reserved means reserved, and only until the end: the holder's process on its device lives while the
    reservation holds the device and is killed by the node's agent once it does not (at its next sweep)."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_NVIDIA_SMI)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    # the holder's process is no child of this test (the in-process agent would take it for its own)
    holder = int(subprocess.run(["sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                                check=True).stdout)
    (tmp_path / "pids").write_text(f"{holder}\n")
    node = cpu_pool.nodes.get()
    gpu = node.gpus.get(index=0)
    now = timezone.now()
    hold = DeviceHold.objects.create(gpu=gpu, node=node, pool=cpu_pool, gpu_type=gpu.gpu_type,
                                     kind=HoldKind.RESERVATION, started=now, ends=now + timedelta(minutes=5))
    agent = in_process_agent(node)
    agent.sweep_s = 0
    try:
        agent.poll()
        assert alive(holder)  # its reservation holds the device
        DeviceHold.objects.filter(pk=hold.pk).update(ended=timezone.now())  # the reservation ended
        agent.poll()
        wait_for(lambda: not alive(holder), 10, "the holder's process to die")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(holder, signal.SIGKILL)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def reservation_hold(node: Node, user, index: int = 0) -> DeviceHold:
    gpu = node.gpus.get(index=index)
    now = timezone.now()
    reservation = Reservation.objects.create(
        user=user, project="p", pool=node.pool, gpu_type=gpu.gpu_type, gpu_count=1, minutes=30, status="active",
        node=node, started_at=now, ends_at=now + timedelta(minutes=30), planned_gpus=[gpu.pk])
    return DeviceHold.objects.create(gpu=gpu, node=node, pool=node.pool, gpu_type=gpu.gpu_type,
                                     reservation=reservation, kind=HoldKind.RESERVATION, user=user, started=now,
                                     ends=reservation.ends_at)


def login(line: str, command: str) -> int:
    """What sshd does with a holder's authorized_keys line: its forced command, run with the ssh command given in
    SSH_ORIGINAL_COMMAND; detached (no child of this process, which the in-process agent would take for its own)."""
    forced = line.split('command="', 1)[1].split('" ssh-', 1)[0].replace('\\"', '"')
    done = subprocess.run(["sh", "-c", 'bash -c "$FORCED" >/dev/null 2>&1 & echo $!'], capture_output=True,
                          text=True, check=True, env={**os.environ, "FORCED": forced, "SSH_ORIGINAL_COMMAND": command})
    return int(done.stdout)


@pytest.mark.django_db
def test_a_reservations_processes_die_at_its_end_even_when_the_next_one_takes_its_devices_at_once(
        cpu_pool, tmp_path, monkeypatch):
    """Processes belong to the reservation, not to the device: the first holder's login (and what it started, on the
    device or not, and one seen on the device under it) dies when its reservation ends, although the next
    reservation holds the same device from that very moment; the next holder's lives."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_NVIDIA_SMI)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    node = cpu_pool.nodes.get()
    first, second = UserFactory(), UserFactory()
    for user in (first, second):
        new_key(user, tmp_path)
    hold = reservation_hold(node, first)
    agent = in_process_agent(node)
    agent.sweep_s = 0
    agent.authorized_keys = tmp_path / "authorized_keys"
    pids = []
    try:
        agent.poll()
        (line,) = agent.authorized_keys.read_text().splitlines()
        on_device = login(line, "sleep 600")  # the first holder's kernel, on the device
        beside = login(line, "sleep 600")  # and something of theirs that never touches it
        untagged = int(subprocess.run(["sh", "-c", "env -u KERNELBOT_RESERVATION sleep 600 >/dev/null 2>&1 & echo $!"],
                                      capture_output=True, text=True, check=True).stdout)  # seen on its device only
        pids = [on_device, beside, untagged]
        (tmp_path / "pids").write_text(f"{on_device}\n{untagged}\n")
        agent.poll()
        assert all(alive(pid) for pid in pids)  # its reservation holds the device
        with transaction.atomic():  # the next reservation takes the device the moment the first ends
            DeviceHold.objects.filter(pk=hold.pk).update(ended=timezone.now())
            Reservation.objects.filter(pk=hold.reservation_id).update(status="ended")
            reservation_hold(node, second)
        agent.poll()
        (line,) = agent.authorized_keys.read_text().splitlines()
        assert f"KERNELBOT_RESERVATION={hold.reservation_id} " not in line
        theirs = login(line, "sleep 600")
        pids.append(theirs)
        (tmp_path / "pids").write_text(f"{on_device}\n{untagged}\n{theirs}\n")
        agent.poll()
        wait_for(lambda: not any(alive(pid) for pid in pids[:3]), 10, "the first holder's processes to die")
        agent.poll()
        assert alive(theirs)  # the next holder's, on the same device, lives
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if agent.holds is not None:
            agent.holds.end(set())


@pytest.mark.django_db
def test_an_expiring_reservations_processes_die_at_its_end_without_a_wake_up_or_the_reaper(cpu_pool, tmp_path,
                                                                                          settings):
    """The agent asks again at a reservation's end (`ends_in` of its answer): the holder's process dies then, though
    nothing wakes the node, no reaper marks the reservation expired and the agent's wait and poll are 10 minutes."""
    settings.RUNNER_KEY = f"expiry-{uuid.uuid4().hex}"  # an installation of its own: no other test's agent sweeps it
    node = cpu_pool.nodes.get()
    hold = reservation_hold(node, UserFactory())
    ends_at = timezone.now() + timedelta(seconds=2)
    Reservation.objects.filter(pk=hold.reservation_id).update(ends_at=ends_at)
    agent = in_process_agent(node)
    agent._holds, agent.workroot, agent.poll_s, agent.wait_s = [None], tmp_path, 600.0, 600.0
    agent.register = lambda report=None: {}  # registered already
    killed: list[tuple[int, float]] = []
    kill = agent.kill
    agent.kill = lambda pid: killed.append((pid, time.time())) or kill(pid)
    holder = int(subprocess.run(
        ["sh", "-c", "setsid sleep 600 >/dev/null 2>&1 </dev/null & echo $!"], capture_output=True, text=True,
        check=True, env={**os.environ, "KERNELBOT_RESERVATION": str(hold.reservation_id),
                         "KERNELBOT_INSTALLATION": agent.installation}).stdout)

    def watch() -> None:
        deadline = time.monotonic() + 60
        while alive(holder) and time.monotonic() < deadline:
            time.sleep(0.05)
        agent.stopping.set()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        agent.serve()
        assert not alive(holder)
        (when,) = [at for pid, at in killed if pid == holder]
        assert ends_at.timestamp() <= when < ends_at.timestamp() + 10  # at its end, not the next heartbeat
        assert Reservation.objects.get(pk=hold.reservation_id).status == "active"  # no reaper did it
    finally:
        agent.stopping.set()
        with contextlib.suppress(ProcessLookupError):
            os.kill(holder, signal.SIGKILL)


@pytest.mark.django_db
def test_a_reservation_past_its_end_leaves_its_nodes_answer_before_the_reaper_marks_it(cpu_pool, tmp_path):
    """The node's answer is what its agent acts on: a reservation whose `ends_at` has passed is not in it (nor its
    holder's keys) though it is still ACTIVE with its hold open; one still running says when it ends (`ends_in`)."""
    node = cpu_pool.nodes.get()
    Gpu.objects.create(node=node, gpu_type=cpu_pool.cpu, index=1)
    ending, going_on = UserFactory(), UserFactory()
    for user in (ending, going_on):
        new_key(user, tmp_path)
    over = reservation_hold(node, ending, index=0)
    on = reservation_hold(node, going_on, index=1)
    Reservation.objects.filter(pk=over.reservation_id).update(ends_at=timezone.now() - timedelta(seconds=1))
    answer = node_call("poll", {"pool": cpu_pool.name, "hostname": node.hostname, "free": []}).json()
    (listed,) = answer["reservations"]
    assert listed["id"] == on.reservation_id and listed["gpus"] == [1] and 1790 < listed["ends_in"] <= 1800
    assert answer["reserved"] == [1] and [k["reservation"] for k in answer["keys"]] == [on.reservation_id]
    assert Reservation.objects.get(pk=over.reservation_id).status == "active"  # the reaper has not run


def new_key(user, directory: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(directory / f"key{user.pk}")], check=True)
    keys.do_add_key(user, (directory / f"key{user.pk}.pub").read_text())


@pytest.mark.slow
def test_an_agent_killed_outright_leaves_nothing_that_the_next_one_does_not_sweep_when_it_starts(
        live_pool, runner_platform, tmp_path):
    """A SIGKILLed agent leaves its run's directory (the competitor's submission.py) and its reservations' SSH key
    lines; the next agent on the machine removes both when it starts, before it has even reached the platform."""
    task = load_task(REPO / "problems" / "demo" / "vectoradd_py")
    leaderboard = factories.LeaderboardFactory(problem=factories.problem_from(task), gpu_types=[live_pool.cpu])
    node = live_pool.nodes.get()
    Gpu.objects.create(node=node, gpu_type=live_pool.cpu, index=1)  # what the reservation holds, not the runs' device
    holder = UserFactory()
    new_key(holder, tmp_path)
    reservation_hold(node, holder, index=1)
    authorized = tmp_path / "authorized_keys"
    authorized.write_text("ssh-ed25519 AAAA someone else\n")
    args = ("--authorized-keys", str(authorized))
    agent = start_agent(runner_platform.url, live_pool.name, "localhost", args=args)
    successor = None
    try:
        wait_for(lambda: "kernelbot-node-agent-reservation-" in authorized.read_text(), 120, "the holder's key line")
        slow = CODE + b"\nimport time as _t\n_orig = custom_kernel\ndef custom_kernel(data):\n    _t.sleep(60)\n" \
                      b"    return _orig(data)\n"
        run = submit(leaderboard, code=slow).runs.get()
        dispatch_all()
        wait_for(lambda: Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING, started_at__gt=F("dispatched_at"))
                 .exists(), 60, "the slow run's job fetched")  # a claim not fetched yet holds for the agent deadline
        code = wait_for(lambda: [p for p in settings.RUNS_DIR.glob("kernelbot-run-*/**/submission.py")
                                 if b"_t.sleep(60)" in p.read_bytes()], 60, "the run's submission.py")
        left = code[0].relative_to(settings.RUNS_DIR).parts[0]
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait()
        wait_for(lambda: not [p for p in Path("/proc").glob("[0-9]*") if _home_in(p, settings.RUNS_DIR / left)], 30,
                 "the killed agent's harness to go")
        assert (settings.RUNS_DIR / left).exists() and "kernelbot-node-agent-reservation-" in authorized.read_text()

        # the next agent cannot even reach the platform: it sweeps anyway, first thing
        successor = start_agent("http://127.0.0.1:9", live_pool.name, "localhost", args=args)
        wait_for(lambda: not (settings.RUNS_DIR / left).exists(), 60, "the run directory to be removed")
        wait_for(lambda: authorized.read_text() == "ssh-ed25519 AAAA someone else\n", 30, "the key lines to go")
    finally:
        for proc in (agent, successor):
            if proc is not None:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                reap_group(proc.pid)


def _home_in(proc: Path, directory: Path) -> bool:
    try:
        return f"HOME={directory}".encode() in (proc / "environ").read_bytes()
    except OSError:
        return False


def statements(queries) -> list[str]:
    """What a step sent PostgreSQL, savepoints (the test's transaction) left out, each as its verb and first table."""
    found = []
    for sql in (q["sql"] for q in queries):
        if sql.startswith(("SAVEPOINT", "RELEASE SAVEPOINT")):
            continue
        verb = sql.split(None, 1)[0]
        table = re.search(r'(?:FROM|INTO|UPDATE) "(\w+)"', sql)
        found.append(f"{verb} {table.group(1) if table else ''}".strip())
    return found


@pytest.mark.django_db
def test_a_runs_trip_through_a_node_agent_reads_nothing_it_already_has(leaderboard, cpu_pool):
    """A burst is paid for in statements per run (issue 50): the dispatch reads no more than the run and its pools
    (its agents build the job), a claim neither asks again whether a run waits nor reads the attempt it just locked,
    and the job's fetch takes the attempt from its token's check."""
    node = cpu_pool.nodes.get()
    run = submit(leaderboard).runs.get()
    with CaptureQueriesContext(connection) as queries:
        lifecycle.dispatch_run(run.pk)
    assert statements(queries) == ["SELECT leaderboards_run", "SELECT runners_gpupool", "UPDATE leaderboards_run",
                                   "INSERT leaderboards_runattempt"]
    body = {"pool": cpu_pool.name, "hostname": node.hostname, "free": [0]}
    with CaptureQueriesContext(connection) as queries:
        [claim] = node_call("poll", body).json()["claims"]
    claimed = Counter(statements(queries))
    assert claimed["SELECT leaderboards_run"] == 2, claimed  # what waits (with its GPU types), then the candidates
    assert claimed["SELECT leaderboards_runattempt"] == 0 and claimed["UPDATE leaderboards_run"] == 1, claimed
    assert claimed["SELECT reservations_devicehold"] == 2, claimed  # the pool's reservations; the devices' holds
    route = f"/api/runner/v1/runs/{claim['run']}/{claim['attempt']}/"
    with CaptureQueriesContext(connection) as queries:
        fetched = Client().get(route + "job", {"host": node.hostname, "gpus": ""},
                               headers={"Authorization": f"Bearer {claim['token']}"})
    assert fetched.status_code == 200 and fetched.json()["job"]
    assert Counter(statements(queries))["SELECT leaderboards_runattempt"] == 1  # the token's check
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.started_at > run.dispatched_at  # the fetch was seen as the start
