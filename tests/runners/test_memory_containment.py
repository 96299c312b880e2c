"""A node that cannot contain memory says so: its probe reports why no memory cgroup is usable; the pool's health check
fails under KERNELBOT_SANDBOX=require with that reason and the fix, and otherwise passes with a warning that the pool
page, the pool list and the node's row show. No cgroup is mocked where the probe itself runs: KERNELBOT_CGROUP names
a plain directory, as unusable to the sandbox as an undelegated service cgroup on a cgroup v2 machine."""

from __future__ import annotations

import json
import os

import pytest
from django.core.management import call_command

from leaderboards import lifecycle
from leaderboards.health import do_start_pool_check
from leaderboards.models import RunStatus
from runners.actions import probe_this_machine
from runners.harness import cgroups
from runners.harness.probe import probe, sandbox_facts
from runners.models import (
    CheckOutcome,
    GpuPool,
    GpuType,
    GpuVendor,
    Node,
    NodeService,
    PoolCheck,
    PoolHealth,
    RunnerBackendName,
)
from runners.pools import MEMORY_FIX_DOC, Contained, containment
from tests.agents import in_process_agent
from tests.conftest import require_tool
from tests.factories import submission

pytestmark = pytest.mark.django_db
FIX = f"delegate the memory controller to the runner's service ({MEMORY_FIX_DOC})"
DELEGATED = "/sys/fs/cgroup/system.slice/kernelbot-workers.service"


@pytest.fixture
def undelegated(tmp_path, monkeypatch) -> str:
    """Why the sandbox finds no memory cgroup once KERNELBOT_CGROUP names a directory that is not one."""
    monkeypatch.setenv("KERNELBOT_CGROUP", str(tmp_path))
    return f"cgroup v1: {os.path.realpath(tmp_path)} is not a memory-controller group"


def node_check(pool: GpuPool) -> PoolCheck:
    return PoolCheck.objects.get(pool=pool, node__isnull=False, run_id__isnull=True)


def test_the_probe_says_why_no_memory_cgroup_is_usable(undelegated, monkeypatch):
    require_tool("bwrap")  # without it the sandbox refuses for want of bubblewrap before it looks for a cgroup
    monkeypatch.setenv("KERNELBOT_SANDBOX", "require")
    facts = probe()["sandbox"]
    assert facts["mode"] == "require" and facts["memory_cgroup"] is None
    assert facts["memory_cgroup_error"] == undelegated
    assert "no memory cgroup is usable" in facts["error"]  # the sandbox itself refuses: KERNELBOT_SANDBOX=require

    monkeypatch.setenv("KERNELBOT_SANDBOX", "none")
    assert sandbox_facts()["memory_cgroup_error"] == "KERNELBOT_SANDBOX=none: no memory cgroup is used"
    monkeypatch.setenv("KERNELBOT_SANDBOX", "auto")
    monkeypatch.setattr(cgroups, "memory_parent", lambda: cgroups.MemoryParent("v2", DELEGATED))
    assert sandbox_facts()["memory_cgroup"] == f"v2 {DELEGATED}"


@pytest.mark.parametrize("facts, state, says", [
    ({}, Contained.UNKNOWN, "gpu1: not reported yet"),
    ({"mode": "require", "memory_cgroup": f"v2 {DELEGATED}"}, Contained.CGROUP,
     f"gpu1: each run's memory is contained by a cgroup in v2 {DELEGATED}"),
    ({"mode": "require", "memory_cgroup": None, "memory_cgroup_error": "why"}, Contained.REFUSED,
     f"node gpu1 cannot contain memory: why; {FIX}. Under KERNELBOT_SANDBOX=require it refuses every run"),
    ({"mode": "auto", "memory_cgroup": None, "memory_cgroup_error": "why"}, Contained.PER_PROCESS,
     f"runs on node gpu1 have per-process memory limits only: why; {FIX}, then set KERNELBOT_SANDBOX=require"),
    ({"mode": "none", "memory_cgroup": None, "memory_cgroup_error": "x"}, Contained.PER_PROCESS,
     "runs on node gpu1 have per-process memory limits only: KERNELBOT_SANDBOX=none"),
])
def test_a_nodes_containment_from_its_facts(facts, state, says):
    found = containment("gpu1", facts)
    assert found.state == state and found.summary.startswith(says)
    assert bool(found.problem) == (state == Contained.REFUSED)
    assert bool(found.warning) == (state == Contained.PER_PROCESS)


def test_under_require_a_node_without_a_memory_cgroup_is_out_of_service_and_never_takes_a_run(
        cpu_pool, leaderboard, undelegated, monkeypatch, settings, admin_client, django_capture_on_commit_callbacks):
    sent = submission(leaderboard, mode="test").runs.get()
    lifecycle.dispatch_run(sent.pk)  # sent to the pool before the node's agent registered
    monkeypatch.setenv("KERNELBOT_SANDBOX", "require")
    agent = in_process_agent(cpu_pool.nodes.get(), probe_this_machine())  # its agent's probe, for real
    reason = (f"node localhost cannot contain memory: {undelegated}; {FIX}. Under KERNELBOT_SANDBOX=require it "
              "refuses every run until it can")
    node = Node.objects.get(pool=cpu_pool)
    assert (node.service, node.service_detail) == (NodeService.SANDBOX, reason)  # from its registration on
    assert node.sandbox["mode"] == "require" and node.sandbox["memory_cgroup_error"] == undelegated and node.probed_at
    assert agent.drain() == 0  # it takes no run
    sent.refresh_from_db()
    assert sent.status == RunStatus.DISPATCHED and not sent.attempts.exclude(external_id="").exists()
    waiting = submission(leaderboard, mode="test").runs.get()
    lifecycle.dispatch_run(waiting.pk)
    waiting.refresh_from_db()
    assert waiting.status == RunStatus.QUEUED  # no node of its type is in service: it waits

    with django_capture_on_commit_callbacks(execute=False):
        do_start_pool_check(cpu_pool)
    cpu_pool.refresh_from_db()
    assert cpu_pool.health == PoolHealth.FAILING and cpu_pool.health_detail == f"localhost is out of service: {reason}"
    assert PoolCheck.objects.get(pool=cpu_pool, node=node).outcome == CheckOutcome.FAILING
    assert not PoolCheck.objects.filter(pool=cpu_pool, run_id__isnull=False).exists()  # no check run for it either
    assert not GpuPool.objects.taking_runs(cpu_pool.cpu).exists()

    page = admin_client.get(f"/admin/runners/gpupool/{cpu_pool.pk}/change/").content.decode()
    assert "Memory containment (per node):" in page and "✖</span> node localhost cannot contain memory: " in page
    assert f"<code>{MEMORY_FIX_DOC}</code>" in page
    settings.DOCS_URL = "https://example.org/kernelbot/docs"
    page = admin_client.get(f"/admin/runners/gpupool/{cpu_pool.pk}/change/").content.decode()
    assert (f'<a href="https://example.org/kernelbot/docs/operations.md#delegating-the-memory-controller-to-the-'
            f'runner">{MEMORY_FIX_DOC}</a>') in page
    assert "✖ refused on localhost" in admin_client.get("/admin/runners/gpupool/").content.decode()
    nodes = admin_client.get("/admin/runners/node/").content.decode()
    assert "node localhost cannot contain memory" in nodes and "✖ out of service since" in nodes

    monkeypatch.setattr(cgroups, "memory_parent", lambda: cgroups.MemoryParent("v2", DELEGATED))
    in_process_agent(node, probe())  # delegated, its agent registers again: back in service
    node.refresh_from_db()
    assert node.in_service and node.service_detail == ""


@pytest.mark.slow
def test_otherwise_the_pool_passes_and_the_admin_warns_of_per_process_limits(
        cpu_pool, undelegated, monkeypatch, sync_queue, admin_client, django_capture_on_commit_callbacks):
    monkeypatch.setenv("KERNELBOT_SANDBOX", "auto")
    in_process_agent(cpu_pool.nodes.get(), probe_this_machine())
    with django_capture_on_commit_callbacks(execute=True):  # the check's run on the real harness, uncontained
        do_start_pool_check(cpu_pool)
    cpu_pool.refresh_from_db()
    assert cpu_pool.health == PoolHealth.OK and cpu_pool.health_detail == ""
    warning = f"runs on node localhost have per-process memory limits only: {undelegated}; {FIX}"
    check = node_check(cpu_pool)
    assert check.outcome == CheckOutcome.OK
    assert check.detail == f"agent live on localhost; {warning}, then set KERNELBOT_SANDBOX=require"
    run_check = PoolCheck.objects.get(pool=cpu_pool, run_id__isnull=False)
    assert f"with per-process memory limits only ({undelegated})" in run_check.detail

    page = admin_client.get(f"/admin/runners/gpupool/{cpu_pool.pk}/change/").content.decode()
    assert "⚠</span> runs on node localhost have per-process memory limits only: " in page
    assert f"<code>{MEMORY_FIX_DOC}</code>" in page
    assert "⚠ per-process only on localhost" in admin_client.get("/admin/runners/gpupool/").content.decode()
    assert "per-process memory limits only" in admin_client.get("/admin/runners/node/").content.decode()


def test_a_node_with_a_delegated_memory_cgroup_passes_its_check(cpu_pool, monkeypatch, admin_client,
                                                                django_capture_on_commit_callbacks):
    monkeypatch.setenv("KERNELBOT_SANDBOX", "require")
    monkeypatch.setattr(cgroups, "memory_parent", lambda: cgroups.MemoryParent("v2", DELEGATED))
    in_process_agent(cpu_pool.nodes.get(), probe())  # in this process, so memory_parent can be stood in for
    with django_capture_on_commit_callbacks(execute=False):
        do_start_pool_check(cpu_pool)
    cpu_pool.refresh_from_db()
    check = node_check(cpu_pool)
    assert (check.outcome, check.detail) == (CheckOutcome.OK, "agent live on localhost")
    assert cpu_pool.health != PoolHealth.FAILING and GpuPool.objects.taking_runs(cpu_pool.cpu).exists()
    page = admin_client.get(f"/admin/runners/gpupool/{cpu_pool.pk}/change/").content.decode()
    assert f"✔</span> localhost: each run&#x27;s memory is contained by a cgroup in v2 {DELEGATED}" in page
    assert "✔ cgroup" in admin_client.get("/admin/runners/gpupool/").content.decode()


def test_a_registered_remote_node_reports_its_containment_to_its_pools_check(
        tmp_path, capsys, django_capture_on_commit_callbacks):
    GpuType.objects.create(name="CPU", vendor=GpuVendor.CPU)
    pool = GpuPool.objects.create(name="lab", backend=RunnerBackendName.SLURM)
    why = "cgroup v2: memory is not enabled in /sys/fs/cgroup/system.slice/slurmd.service/cgroup.subtree_control"
    report = tmp_path / "probe.json"
    report.write_text(json.dumps({"hostname": "cpu-box", "cpu": "AMD EPYC", "cpus": 2, "devices": [], "source": "none",
                                  "sandbox": {"mode": "require", "backend": "unavailable", "memory_cgroup": None,
                                              "memory_cgroup_error": why}}))
    call_command("register_node", "lab", "--probe-file", str(report))
    assert f"memory: node cpu-box cannot contain memory: {why}; {FIX}" in capsys.readouterr().out
    with django_capture_on_commit_callbacks(execute=False):
        do_start_pool_check(pool)
    pool.refresh_from_db()
    assert pool.health == PoolHealth.FAILING
    assert pool.health_detail.startswith(f"nodes: node cpu-box cannot contain memory: {why}; {FIX}")

    facts = json.loads(report.read_text())  # delegated and registered again: the next round passes its nodes
    facts["sandbox"].update(memory_cgroup="v2 /sys/fs/cgroup/system.slice/slurmd.service", memory_cgroup_error="")
    report.write_text(json.dumps(facts))
    call_command("register_node", "lab", "--probe-file", str(report))
    node = Node.objects.get(pool=pool, hostname="cpu-box")
    assert containment(node.hostname, node.sandbox).state == Contained.CGROUP
    PoolCheck.objects.filter(pool=pool).update(outcome=CheckOutcome.OK)  # the first round's run, as if it ended
    with django_capture_on_commit_callbacks(execute=False):
        checks = do_start_pool_check(pool)
    assert [c.run_id is not None for c in checks] == [True]  # its run only: nothing left to say about its node
