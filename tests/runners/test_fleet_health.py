"""A fleet's health without the harness: a new node proves itself at once, one truth about a node (admin, model,
health API, /metrics), a dead agent's runs retried within the agent deadline, and health rounds that cannot flood
(a rolling wave, checks yielding to competitors' runs, a late platform never charged to a node)."""

from __future__ import annotations

import re
from collections import Counter
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone
from django_q.conf import Conf
from prometheus_client.parser import text_string_to_metric_families

from leaderboards import lifecycle
from leaderboards.health import LATE_PREFIX, OWN_CHECK, do_finish_pool_checks, do_start_pool_check
from leaderboards.lifecycle import dispatch_run
from leaderboards.models import Run, RunStatus
from runners.actions import gpu_availability
from runners.harness.node import node_token
from runners.models import CheckOutcome, Gpu, GpuPool, Node, NodeService, PoolCheck, PoolHealth

from ..factories import ranked_result, remote_pool, submission

pytestmark = pytest.mark.django_db
CPU_PROBE = {"hostname": "ignored", "cpu": "AMD EPYC", "cpus": 2, "devices": [], "source": "none"}


@pytest.fixture
def inline_tasks(monkeypatch, django_capture_on_commit_callbacks):
    """Tasks sent on commit run inline, in this process (no agent drains them: the tests play the agents)."""
    monkeypatch.setattr(Conf, "SYNC", True)
    return lambda: django_capture_on_commit_callbacks(execute=True)


def register(client, pool: GpuPool, hostname: str) -> dict:
    response = client.post("/api/runner/v1/nodes/register", {"pool": pool.name, "hostname": hostname,
                                                              "probe": CPU_PROBE, "agent": {"pid": 1}},
                           content_type="application/json",
                           headers={"Authorization": f"Bearer {node_token(settings.RUNNER_KEY, pool.name, hostname)}"})
    assert response.status_code == 200, response.content
    return response.json()


def pass_claims(node: Node, inline_tasks) -> list[int]:
    """The node's agent claims what waits for it and reports a pass for each; the runs' ids."""
    claims = lifecycle.do_claim_runs(node, [0])
    for claim in claims:
        with inline_tasks():
            assert lifecycle.do_ingest_result(claim["run"], claim["attempt"], ranked_result([1000.0]))
    return [claim["run"] for claim in claims]


def test_a_failing_pool_is_back_as_soon_as_a_new_node_registers_and_passes(cpu_pool, leaderboard, client,
                                                                           inline_tasks):
    cpu_pool.nodes.update(service=NodeService.FAILED_CHECK, service_detail="its health check failed: boom")
    GpuPool.objects.filter(pk=cpu_pool.pk).update(health=PoolHealth.FAILING, health_detail="boom")
    waiting = submission(leaderboard, mode="test").runs.get()
    dispatch_run(waiting.pk)
    assert Run.objects.get(pk=waiting.pk).status == RunStatus.QUEUED

    with inline_tasks():
        answer = register(client, cpu_pool, "newbox")
    assert answer["out_of_service"] == ""
    node = Node.objects.get(pool=cpu_pool, hostname="newbox")
    check = PoolCheck.objects.get(node=node)
    assert check.outcome == CheckOutcome.PENDING and check.detail == OWN_CHECK
    assert GpuPool.objects.get(pk=cpu_pool.pk).health == PoolHealth.FAILING  # not before it passed
    assert Run.objects.get(pk=check.run_id).status == RunStatus.DISPATCHED  # to its node, at once

    assert pass_claims(node, inline_tasks) == [check.run_id]  # the check first: the competitor's run still waits
    check.refresh_from_db()
    pool = GpuPool.objects.get(pk=cpu_pool.pk)
    assert check.outcome == CheckOutcome.OK and pool.health == PoolHealth.OK and pool.last_ok_at
    assert gpu_availability([cpu_pool.cpu.pk]) == {cpu_pool.cpu.pk: None}
    assert Run.objects.get(pk=waiting.pk).status == RunStatus.DISPATCHED  # sent again the moment the pool passed
    assert pass_claims(node, inline_tasks) == [waiting.pk]

    with inline_tasks():
        register(client, cpu_pool, "newbox")  # a restart of a node in service of a healthy pool starts no check
    assert PoolCheck.objects.filter(node=node).count() == 1


def test_a_new_pools_first_node_brings_it_up(cpu_pool, client, inline_tasks):
    pool = GpuPool.objects.create(name="fresh")  # added, then checked (the schedule's first round) before any agent
    with inline_tasks():
        do_start_pool_check(pool)
    pool.refresh_from_db()
    assert pool.health == PoolHealth.FAILING and pool.health_detail == "no enabled device to check"
    with inline_tasks():
        register(client, pool, "box")
    own = pool.checks.get(node__hostname="box")
    assert own.outcome == CheckOutcome.PENDING
    pass_claims(Node.objects.get(pool=pool), inline_tasks)
    pool.refresh_from_db()
    own.refresh_from_db()
    assert pool.health == PoolHealth.OK and own.outcome == CheckOutcome.OK


def admin_state(admin_client, node: Node) -> str:
    page = admin_client.get(f"/admin/runners/node/{node.pk}/change/").content.decode()
    states = set(re.findall(r'data-state="(\w+)"', page))
    assert len(states) == 1, states
    return states.pop()


def test_the_admin_the_row_the_health_api_and_metrics_agree_on_every_node(cpu_pool, admin_client, settings):
    settings.METRICS_TOKEN = "metrics-token-0123456789"
    now = timezone.now()
    nodes = {"localhost": cpu_pool.nodes.get()}
    for hostname, service, seen in (("dead", NodeService.IN_SERVICE, now - timedelta(seconds=settings.AGENT_DEADLINE
                                                                                      + 5)),
                                    ("failed", NodeService.FAILED_CHECK, now), ("never", NodeService.IN_SERVICE, None)):
        nodes[hostname] = Node.objects.create(pool=cpu_pool, hostname=hostname, service=service, agent_seen_at=seen,
                                              service_detail="its health check failed: x" if seen == now else "")
        Gpu.objects.create(node=nodes[hostname], gpu_type=cpu_pool.cpu, index=0)

    def views() -> dict[str, str]:
        shown = {hostname: admin_state(admin_client, node) for hostname, node in nodes.items()}
        metrics = admin_client.get("/metrics", headers={"Authorization": f"Bearer {settings.METRICS_TOKEN}"})
        counted = {s.labels["service"]: s.value for family in text_string_to_metric_families(metrics.content.decode())
                   for s in family.samples if s.name == "kernelbot_nodes" and s.labels["pool"] == cpu_pool.name}
        assert counted == Counter(shown.values())
        out = admin_client.get("/api/v1/health/runners").json()["nodes_out_of_service"]
        assert {n["hostname"]: n["service"] for n in out} == {h: s for h, s in shown.items() if s != "in_service"}
        assert {h: Node.objects.get(pk=n.pk).state for h, n in nodes.items()} == shown
        return shown

    expected = {"localhost": "in_service", "dead": "no_agent", "failed": "failed_check", "never": "no_agent"}
    assert views() == expected  # before the reaper wrote anything
    lifecycle.do_reap_overdue_runs()
    assert views() == expected
    dead = Node.objects.get(pk=nodes["dead"].pk)
    assert dead.service == NodeService.NO_AGENT and "no agent heard from on dead" in dead.service_detail
    lifecycle.do_node_heartbeat(dead, [0])  # its agent is back: so is the node
    assert admin_state(admin_client, dead) == "in_service" == Node.objects.get(pk=dead.pk).service


def test_a_killed_agents_run_is_retried_at_the_agent_deadline(cpu_pool, leaderboard, settings):
    node = cpu_pool.nodes.get()
    run = submission(leaderboard, mode="test").runs.get()
    dispatch_run(run.pk)
    [claim] = lifecycle.do_claim_runs(node, [0])
    Run.objects.filter(pk=run.pk).update(status_deadline=timezone.now() + timedelta(hours=1))  # its deadline is far
    lifecycle.do_reap_overdue_runs()
    assert Run.objects.get(pk=run.pk).attempt == claim["attempt"]  # its agent is live: nothing happens

    Node.objects.filter(pk=node.pk).update(agent_seen_at=timezone.now() - timedelta(seconds=settings.AGENT_DEADLINE
                                                                                     + 1))  # killed
    lifecycle.do_reap_overdue_runs()
    run.refresh_from_db()
    retried = run.attempts.get(number=claim["attempt"])
    assert run.status in (RunStatus.QUEUED, RunStatus.DISPATCHED) and run.attempt >= claim["attempt"]
    assert retried.outcome == "retried" and "was not heard from within" in retried.reason
    assert run.infra_failures == 1  # never charged to the competitor


def running_checks(pool: GpuPool) -> list[PoolCheck]:
    return list(pool.checks.filter(outcome=CheckOutcome.PENDING, run_id__isnull=False).select_related("node"))


def test_a_round_over_many_nodes_is_a_bounded_rolling_wave(cpu_pool, settings, inline_tasks):
    settings.POOL_CHECK_WAVE, settings.POOL_CHECK_SPREAD = 2, 0  # the bound alone (the pace: the next test)
    for i in range(4):
        node = Node.objects.create(pool=cpu_pool, hostname=f"n{i}", agent_seen_at=timezone.now())
        Gpu.objects.create(node=node, gpu_type=cpu_pool.cpu, index=0)
    with inline_tasks():
        do_start_pool_check(cpu_pool)
    assert len(running_checks(cpu_pool)) == 2  # not five at once
    assert cpu_pool.checks.filter(outcome=CheckOutcome.PENDING, run_id__isnull=True).count() == 3
    passed = []
    while checks := running_checks(cpu_pool):
        assert len(checks) <= 2
        passed += pass_claims(checks[0].node, inline_tasks)  # its end starts the next node's
    assert len(passed) == len(set(passed)) == 5
    assert not cpu_pool.checks.filter(outcome=CheckOutcome.PENDING).exists()
    assert all(Run.objects.get(pk=pk).attempt == 1 for pk in passed)  # none claimed twice
    assert set(cpu_pool.nodes.values_list("service", flat=True)) == {NodeService.IN_SERVICE}
    assert GpuPool.objects.get(pk=cpu_pool.pk).health == PoolHealth.OK


def test_a_large_pools_round_is_spread_over_its_pace_not_started_as_fast_as_checks_end(cpu_pool, settings,
                                                                                       inline_tasks):
    settings.POOL_CHECK_WAVE, settings.POOL_CHECK_SPREAD = 2, 100
    for i in range(5):
        node = Node.objects.create(pool=cpu_pool, hostname=f"n{i}", agent_seen_at=timezone.now())
        Gpu.objects.create(node=node, gpu_type=cpu_pool.cpu, index=0)
    with inline_tasks():
        do_start_pool_check(cpu_pool)
    first = running_checks(cpu_pool)
    assert len(first) == 2  # the first wave at once
    started_at = first[0].started_at
    assert pass_claims(first[0].node, inline_tasks)
    assert len(running_checks(cpu_pool)) == 1  # its end starts nobody: 6 nodes over 100 s, one each ~17 s
    with inline_tasks():
        do_finish_pool_checks(now=started_at + timedelta(seconds=10))  # `tick`, 10 s in: not yet
    assert len(running_checks(cpu_pool)) == 1
    with inline_tasks():
        do_finish_pool_checks(now=started_at + timedelta(seconds=20))  # 20 s in: one more
    assert len(running_checks(cpu_pool)) == 2
    for check in running_checks(cpu_pool):
        assert pass_claims(check.node, inline_tasks)
    with inline_tasks():
        do_finish_pool_checks(now=started_at + timedelta(seconds=100))  # the spread is over: the rest, two at a time
    assert len(running_checks(cpu_pool)) == 2
    while checks := running_checks(cpu_pool):
        assert pass_claims(checks[0].node, inline_tasks)
        with inline_tasks():
            do_finish_pool_checks(now=started_at + timedelta(seconds=100))
    assert not cpu_pool.checks.filter(outcome=CheckOutcome.PENDING).exists()
    assert cpu_pool.checks.filter(outcome=CheckOutcome.OK, run_id__isnull=False).count() == 6
    assert set(cpu_pool.nodes.values_list("service", flat=True)) == {NodeService.IN_SERVICE}


def test_check_runs_yield_to_competitors_runs(cpu_pool, leaderboard, inline_tasks):
    with inline_tasks():
        do_start_pool_check(cpu_pool)
    [check] = running_checks(cpu_pool)
    competitor = submission(leaderboard, mode="test").runs.get()
    dispatch_run(competitor.pk)  # younger than the check's run
    node = cpu_pool.nodes.get()
    assert pass_claims(node, inline_tasks) == [competitor.pk]
    assert pass_claims(node, inline_tasks) == [check.run_id]


def test_a_check_late_through_no_fault_of_its_node_is_retried_never_charged(cpu_pool, settings, inline_tasks):
    with inline_tasks():
        do_start_pool_check(cpu_pool)
    [check] = running_checks(cpu_pool)
    node = cpu_pool.nodes.get()
    later = timezone.now() + timedelta(seconds=settings.POOL_CHECK_TIMEOUT + 1)
    with inline_tasks():  # never claimed within its timeout: the node was busy, or the platform behind
        do_finish_pool_checks(now=later)
    assert Run.objects.get(pk=check.run_id).status == RunStatus.CANCELLED
    [again] = running_checks(cpu_pool)
    assert again.run_id != check.run_id and again.node == node
    assert Node.objects.get(pk=node.pk).service == NodeService.IN_SERVICE

    [claim] = lifecycle.do_claim_runs(node, [0])
    assert claim["run"] == again.run_id
    assert lifecycle.do_mark_running(claim["run"], claim["attempt"])  # its job fetched: its heartbeats keep it
    with inline_tasks():  # its heartbeats were not taken in time (the web tier behind) while its agent asks on
        lifecycle.do_reap_overdue_runs(now=timezone.now() + timedelta(seconds=settings.RUN_HEARTBEAT_DEADLINE + 1))
        do_finish_pool_checks()
    retried = Run.objects.get(pk=again.run_id)
    assert retried.attempts.get(number=claim["attempt"]).reason.startswith(LATE_PREFIX)
    assert [c.pk for c in running_checks(cpu_pool)] == [again.pk]  # still its check: not failed
    assert Node.objects.get(pk=node.pk).service == NodeService.IN_SERVICE
    assert pass_claims(node, inline_tasks) == [again.run_id]
    again.refresh_from_db()
    assert again.outcome == CheckOutcome.OK and Node.objects.get(pk=node.pk).in_service


def test_a_remote_pools_late_check_still_fails_its_pool(cpu_pool, settings, django_capture_on_commit_callbacks):
    pool = remote_pool("slurm", cpu_pool.cpu)
    with django_capture_on_commit_callbacks(execute=False):  # its service never takes the run
        do_start_pool_check(pool)
    [check] = pool.checks.filter(outcome=CheckOutcome.PENDING)
    do_finish_pool_checks(now=timezone.now() + timedelta(seconds=settings.POOL_CHECK_TIMEOUT + 1))
    check.refresh_from_db()
    pool.refresh_from_db()
    assert check.outcome == CheckOutcome.FAILING and pool.health == PoolHealth.FAILING
    assert f"no result within {settings.POOL_CHECK_TIMEOUT} s" in check.detail


def test_every_agent_silent_at_once_is_a_stalled_platform_not_a_dead_fleet(cpu_pool, leaderboard, settings):
    for i in range(3):
        Gpu.objects.create(node=Node.objects.create(pool=cpu_pool, hostname=f"n{i}"), gpu_type=cpu_pool.cpu, index=0)
    cpu_pool.nodes.update(agent_seen_at=timezone.now())
    run = submission(leaderboard, mode="test").runs.get()
    dispatch_run(run.pk)
    [claim] = lifecycle.do_claim_runs(Node.objects.get(pool=cpu_pool, hostname="n0"), [0])
    Run.objects.filter(pk=run.pk).update(status_deadline=timezone.now() + timedelta(hours=1))
    cpu_pool.nodes.update(agent_seen_at=timezone.now() - timedelta(seconds=settings.AGENT_DEADLINE + 5))
    assert lifecycle.do_mark_silent_nodes() == 0  # no asks taken at all: the web tier, database or Redis stalled
    assert set(cpu_pool.nodes.values_list("service", flat=True)) == {NodeService.IN_SERVICE}
    assert Run.objects.get(pk=run.pk).attempt == claim["attempt"]
    Node.objects.filter(pool=cpu_pool, hostname="n1").update(agent_seen_at=timezone.now())  # asks are taken again
    assert lifecycle.do_mark_silent_nodes() == 3
    assert Node.objects.get(pool=cpu_pool, hostname="n1").in_service
    assert Run.objects.get(pk=run.pk).attempts.get(number=claim["attempt"]).outcome == "retried"
