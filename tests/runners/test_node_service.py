"""One bad node takes down only itself: a node agents' pool is checked node by node. A node whose agent stopped, whose
sandbox cannot satisfy its mode or that failed its check is out of service with the reason (admin, /api/v1/health/
runners); the pool fails, and submissions for a GPU type are refused, only when no node can serve it. A retried run
goes to a node that has not failed it. Real harness runs through the real runner API (tests/agents.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from leaderboards import lifecycle
from leaderboards.access.actions import do_create_token
from leaderboards.actions import check_submission
from leaderboards.errors import SubmissionRejected
from leaderboards.health import CHECK_DIR, do_finish_pool_checks, do_start_pool_check
from leaderboards.models import Run, RunStatus
from runners.actions import gpu_availability
from runners.models import Gpu, GpuPool, Node, NodeService, PoolHealth

from ..agents import in_process_agent, machine_probe
from ..factories import UserFactory, submission

pytestmark = [pytest.mark.django_db, pytest.mark.slow]
CODE = (CHECK_DIR / "submission.py").read_bytes()  # passes on the demo board too


def second_node(pool: GpuPool, hostname: str = "nodeb") -> Node:
    node = Node.objects.create(pool=pool, hostname=hostname)
    Gpu.objects.create(node=node, gpu_type=pool.cpu, index=0)
    return node


def dispatch_all() -> None:
    for run_id in Run.objects.filter(status=RunStatus.QUEUED).values_list("pk", flat=True):
        lifecycle.dispatch_run(run_id)


def silent(node: Node) -> None:
    Node.objects.filter(pk=node.pk).update(agent_seen_at=timezone.now() - timedelta(hours=1))


def live(*nodes: Node) -> None:
    Node.objects.filter(pk__in=[n.pk for n in nodes]).update(agent_seen_at=timezone.now())


def round_(pool: GpuPool, capture, *agents) -> GpuPool:
    """A health round: its check runs are taken by `agents` in order (each only what is pinned to its node)."""
    with capture(execute=False):
        do_start_pool_check(pool)
        dispatch_all()
        for agent in agents:
            agent.drain()
        do_finish_pool_checks()
    pool.refresh_from_db()
    return pool


def test_a_node_that_stops_polling_is_out_of_service_and_the_pool_serves_on(
        cpu_pool, leaderboard, django_capture_on_commit_callbacks, admin_client, admin_user, client):
    a = in_process_agent(cpu_pool.nodes.get(), machine_probe())
    nodeb = second_node(cpu_pool)
    b = in_process_agent(nodeb, machine_probe())
    silent(nodeb)  # its agent stops polling
    pool = round_(cpu_pool, django_capture_on_commit_callbacks, a)
    nodeb.refresh_from_db()
    assert nodeb.service == NodeService.NO_AGENT and nodeb.service_detail.startswith("no agent on nodeb")
    assert pool.health == PoolHealth.OK and pool.health_detail.startswith("nodeb is out of service: no agent on nodeb")
    assert Node.objects.get(hostname="localhost").in_service
    assert gpu_availability([cpu_pool.cpu.pk]) == {cpu_pool.cpu.pk: None}
    check_submission(UserFactory(), leaderboard.name, ["CPU"], "test", "a.py", CODE)  # no 503

    page = admin_client.get(f"/admin/runners/gpupool/{cpu_pool.pk}/change/").content.decode()
    assert "✖ out of service since" in page and "no agent on nodeb" in page
    assert "OK (nodeb out of service)" in admin_client.get("/admin/runners/gpupool/").content.decode()
    staff = admin_client.get("/api/v1/health/runners").json()
    assert staff["gpu_types"] == {"CPU": None}
    assert [(n["hostname"], n["service"]) for n in staff["nodes_out_of_service"]] == [("nodeb", "no_agent")]
    assert client.get("/api/v1/health/runners").json() == {"gpu_types": {"CPU": None}}  # who is out is staff's
    for user, seen in ((admin_user, staff), (UserFactory(), {"gpu_types": {"CPU": None}})):  # a token, as a session
        bearer = {"Authorization": f"Bearer {do_create_token(user)[1]}"}
        assert client.get("/api/v1/health/runners", headers=bearer).json() == seen
    assert client.get("/api/v1/health/runners", headers={"Authorization": "Bearer kb_wrong"}).status_code == 401

    b.poll()  # its agent is back: so is the node, at once
    nodeb.refresh_from_db()
    assert nodeb.in_service and nodeb.service_detail == ""


def test_a_broken_node_fails_its_own_check_a_retry_avoids_it_and_only_no_node_at_all_fails_the_pool(
        cpu_pool, leaderboard, django_capture_on_commit_callbacks):
    nodea = cpu_pool.nodes.get()
    a = in_process_agent(nodea, machine_probe())
    nodeb = second_node(cpu_pool)
    b = in_process_agent(nodeb, machine_probe(), python="/bin/false")  # misconfigured: no working interpreter

    # a run that nodeb takes first and fails goes to nodea, not back to nodeb
    run = submission(leaderboard, mode="test", code=CODE.decode()).runs.get()
    dispatch_all()
    with django_capture_on_commit_callbacks(execute=False):
        assert b.drain() == 1
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.infra_failures == 1
    dispatch_all()
    live(nodea, nodeb)
    assert b.drain() == 0  # it failed this run and another node can take it
    assert a.drain() == 1
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert [lifecycle.attempt_node(x) for x in run.attempts.values_list("external_id", flat=True)] == [
        nodeb.pk, nodea.pk]

    # its health check fails on nodeb alone: nodeb is out of service, the pool serves on nodea
    live(nodea, nodeb)
    pool = round_(cpu_pool, django_capture_on_commit_callbacks, b, a)
    nodeb.refresh_from_db()
    assert nodeb.service == NodeService.FAILED_CHECK and "/bin/false" in nodeb.service_detail
    assert Node.objects.get(pk=nodea.pk).in_service
    assert pool.health == PoolHealth.OK and "nodeb is out of service: its health check failed" in pool.health_detail
    assert gpu_availability([cpu_pool.cpu.pk]) == {cpu_pool.cpu.pk: None}
    other = submission(leaderboard, mode="test", code=CODE.decode()).runs.get()
    dispatch_all()
    assert b.drain() == 0  # out of service: it takes nothing but its own checks
    assert Run.objects.get(pk=other.pk).status == RunStatus.DISPATCHED
    assert a.drain() == 1

    # nodea's agent stops too: no node serves CPU, so the pool fails and submissions for CPU are refused
    silent(nodea)
    live(nodeb)
    pool = round_(cpu_pool, django_capture_on_commit_callbacks, b)
    assert pool.health == PoolHealth.FAILING
    assert "localhost is out of service: no agent on localhost" in pool.health_detail
    assert "nodeb is out of service: its health check failed" in pool.health_detail
    with pytest.raises(SubmissionRejected) as refused:
        check_submission(UserFactory(), leaderboard.name, ["CPU"], "test", "a.py", CODE)
    assert refused.value.status == 503 and "/bin/false" not in refused.value.message

    a.poll()  # nodea's agent is back: the pool takes runs again at once
    pool.refresh_from_db()
    assert pool.health == PoolHealth.OK and gpu_availability([cpu_pool.cpu.pk]) == {cpu_pool.cpu.pk: None}


def test_a_nodes_next_health_report_says_its_device_was_full_of_other_processes_memory(
        cpu_pool, leaderboard, django_capture_on_commit_callbacks):
    """Issue 34: a run that ran out of device memory other processes held was retried as the runner's failure; the
    node's next check says so, naming the holders, and the node stays in service."""
    from leaderboards.models import RunAttempt
    from runners.harness.device import Holder, busy_message

    node = cpu_pool.nodes.get()
    agent = in_process_agent(node, machine_probe())
    run = submission(leaderboard, mode="test").runs.get()
    said = busy_message([Holder(4242, "alice", 70000 << 20, "0")], "CUDA out of memory")
    RunAttempt.objects.create(run=run, number=99, runner=str(cpu_pool), external_id=lifecycle.agent_job_id(node, [0]),
                              dispatched_at=timezone.now(), finished_at=timezone.now(), outcome="retried", reason=said)
    round_(cpu_pool, django_capture_on_commit_callbacks, agent)
    node.refresh_from_db()
    detail = node.checks.order_by("pk").first().detail
    assert node.in_service
    assert (f"warning: 1 run(s) on {node.hostname} ran out of device memory that other processes held since" in detail
            and "latest: 70,000 MiB of it: pid 4242 (alice, 70,000 MiB on device 0))" in detail), detail
