"""The limits a run's sandbox gets from the platform: the pool's memory setting, the node's share, the uid block."""

import os
import subprocess
import sys

import pytest
from django.core.exceptions import ValidationError

from leaderboards.actions import check_submission, do_submit
from leaderboards.models import RunStatus
from runners.harness import cgroups
from runners.harness.job import parse_job
from runners.harness.sandbox import cpu_limit
from runners.jobs import run_limits, sandbox_uid
from runners.models import Gpu, Node

from ..conftest import REPO
from ..factories import LeaderboardFactory, UserFactory, problem_from

pytestmark = pytest.mark.django_db


def test_pool_memory_setting_and_node_share(cpu_pool):
    gpu = Gpu.objects.get(node__pool=cpu_pool)
    limits = run_limits(gpu)
    assert limits["runs_per_node"] == 1 and "tree_memory_bytes" not in limits  # the harness derives the share
    Gpu.objects.create(node=gpu.node, gpu_type=cpu_pool.cpu, index=1)
    Gpu.objects.create(node=gpu.node, gpu_type=cpu_pool.cpu, index=2, enabled=False)
    other = Node.objects.create(pool=cpu_pool, hostname="elsewhere")
    Gpu.objects.create(node=other, gpu_type=cpu_pool.cpu, index=0)
    cpu_pool.memory_limit_mib = 3072
    cpu_pool.save()
    gpu.refresh_from_db()
    assert run_limits(gpu)["runs_per_node"] == 2  # enabled devices of this node only
    assert run_limits(gpu)["tree_memory_bytes"] == 3 << 30


def test_pool_cpu_setting_reaches_the_harness_and_the_admin_says_what_limits_cpu(cpu_pool, admin_client):
    gpu = Gpu.objects.get(node__pool=cpu_pool)
    assert "cpus_per_device" not in run_limits(gpu)  # the harness derives the node's share
    data = {"name": cpu_pool.name, "backend": "local", "settings": "{}", "enabled": "on", "cpus_per_device": "0",
            "nodes-TOTAL_FORMS": "0", "nodes-INITIAL_FORMS": "0"}
    response = admin_client.post(f"/admin/runners/gpupool/{cpu_pool.pk}/change/", data)
    assert response.status_code == 200 and "At least 1 core." in response.content.decode()
    cpu_pool.cpus_per_device = 3
    cpu_pool.save()
    gpu = Gpu.objects.get(pk=gpu.pk)
    limits = parse_job({"mode": "test", "workdir": "/tmp", "limits": run_limits(gpu)}).sandbox_limits()
    assert limits.cpus_per_device == 3 and cpu_limit(limits, devices=2, cores=64) == 6.0
    gpu.node.sandbox = {"mode": "require", "memory_cgroup": "v2 /sys/fs/cgroup/k",
                        "cpu_limit": "cpu cgroup v2 (/sys/fs/cgroup/k): each run gets its devices' share"}
    gpu.node.save()
    page = admin_client.get(f"/admin/runners/gpupool/{cpu_pool.pk}/change/").content.decode()
    assert "contained by a cgroup in v2 /sys/fs/cgroup/k; CPU: cpu cgroup v2 (/sys/fs/cgroup/k): each run" in page


@pytest.mark.parametrize(("value", "message"), [(512, "At least 1024 MiB"), (1 << 25, "At most 16 TiB")])
def test_pool_memory_setting_validated(cpu_pool, value, message):
    cpu_pool.memory_limit_mib = value
    with pytest.raises(ValidationError, match=message):
        cpu_pool.full_clean()


def test_admin_rejects_a_bad_memory_setting(admin_client, cpu_pool):
    data = {"name": cpu_pool.name, "backend": "local", "settings": "{}", "enabled": "on", "memory_limit_mib": "100",
            "nodes-TOTAL_FORMS": "0", "nodes-INITIAL_FORMS": "0"}
    response = admin_client.post(f"/admin/runners/gpupool/{cpu_pool.pk}/change/", data)
    assert response.status_code == 200 and "At least 1024 MiB" in response.content.decode()
    cpu_pool.refresh_from_db()
    assert cpu_pool.memory_limit_mib is None


def test_sandbox_uid_per_device_within_the_installations_block(cpu_pool, settings):
    gpu = Gpu.objects.get(node__pool=cpu_pool)
    settings.SANDBOX_UID_BASE = 5 << 20
    assert sandbox_uid(gpu) == (5 << 20) + gpu.pk % settings.SANDBOX_UID_SLOTS


def _uid_base(**env: str) -> subprocess.CompletedProcess:
    code = "import kernelbot.settings as s; print(s.SANDBOX_UID_BASE)"
    clean = {k: v for k, v in os.environ.items() if k not in ("KERNELBOT_SANDBOX_UID_BASE", "KERNELBOT_RUNS_DIR")}
    return subprocess.run([sys.executable, "-c", code], env={**clean, **env}, cwd=REPO, capture_output=True,
                          text=True, timeout=60)


def test_uid_block_differs_between_installations(tmp_path):
    one, again = _uid_base(KERNELBOT_RUNS_DIR=str(tmp_path / "a")), _uid_base(KERNELBOT_RUNS_DIR=str(tmp_path / "a"))
    other = _uid_base(KERNELBOT_RUNS_DIR=str(tmp_path / "b"))
    assert one.stdout == again.stdout and one.stdout != other.stdout, (one.stderr, other.stderr)
    for base in (one, other):
        assert int(base.stdout) >= (1 << 20) and int(base.stdout) % (1 << 16) == 0
    assert _uid_base(KERNELBOT_SANDBOX_UID_BASE="200000").stdout == "200000\n"
    bad = _uid_base(KERNELBOT_SANDBOX_UID_BASE="61000")
    assert bad.returncode != 0 and "KERNELBOT_SANDBOX_UID_BASE starts a block of 65536 uids" in bad.stderr


@pytest.mark.slow
def test_pool_memory_limit_stops_a_memory_bomb_end_to_end(cpu_pool, demo_task, sync_queue,
                                                           django_capture_on_commit_callbacks):
    """Through the queue, the local backend and the real harness: the pool's 1 GiB reaches the cgroup."""
    try:
        cgroups.memory_parent()
    except cgroups.CgroupUnavailable:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip("needs a memory cgroup (root or a delegated cgroup)")
    cpu_pool.memory_limit_mib = 1024
    cpu_pool.save()
    leaderboard = LeaderboardFactory(problem=problem_from(demo_task), gpu_types=[cpu_pool.cpu])
    bomb = b"import torch\n_hoard = []\n\ndef custom_kernel(data):\n    a, b = data\n" \
           b"    for _ in range(16):\n        _hoard.append(torch.ones(64 << 20))\n    return a + b\n"
    user = UserFactory()
    request = check_submission(user, leaderboard.name, ["CPU"], "test", "bomb.py", bomb)
    with django_capture_on_commit_callbacks(execute=True):
        submission = do_submit(user, request)
    run = submission.runs.get()
    assert (run.status, run.verdict) == (RunStatus.FAILED, "memory_limit"), run.error
    assert run.error.startswith("memory limit exceeded: the run's processes together reached its 1024 MiB limit")
    assert run.system_info["sandbox"]["memory"]["tree_limit_bytes"] == 1 << 30


@pytest.mark.slow
def test_pool_disk_limit_stops_a_run_filling_its_workdir_and_memory_defaults_to_a_share_end_to_end(
        cpu_pool, demo_task, sync_queue, django_capture_on_commit_callbacks):
    """A run that writes 2 GiB into its working directory, in files each under the file size limit, is killed at the
    pool's 64 MiB; a run's memory cgroup by default is min(8 GiB, 40 %) of this host, not its whole spare memory."""
    cpu_pool.disk_limit_mib = 64
    cpu_pool.save()
    leaderboard = LeaderboardFactory(problem=problem_from(demo_task), gpu_types=[cpu_pool.cpu])
    hog = b"import os\n\ndef custom_kernel(data):\n    a, b = data\n    block = b'x' * (16 << 20)\n" \
          b"    for i in range(128):\n        with open(f'hog-{i}', 'wb') as f:\n            f.write(block)\n" \
          b"            os.fsync(f.fileno())\n    return a + b\n"
    user = UserFactory()
    request = check_submission(user, leaderboard.name, ["CPU"], "test", "hog.py", hog)
    with django_capture_on_commit_callbacks(execute=True):
        submission = do_submit(user, request)
    run = submission.runs.get()
    assert (run.status, run.verdict) == (RunStatus.FAILED, "crash"), run.error
    assert "disk limit exceeded: the run's files in its working directory passed its 64 MiB limit" in run.error
    sandbox = run.system_info["sandbox"]
    assert sandbox["disk_limit_bytes"] == 64 << 20
    if sandbox["memory"]["cgroup"]:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        usable = total - max(2 << 30, total // 5)
        assert sandbox["memory"]["tree_limit_bytes"] == min(8 << 30, int(total * 0.4), usable) < usable


@pytest.mark.slow
def test_problem_needing_cuda_on_a_cpu_runner_is_not_the_users_fault(cpu_pool, demo_task, sync_queue, settings,
                                                                      django_capture_on_commit_callbacks):
    """The harness answers status error: retried a bounded number of times, then ERROR with the clear message."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("asserts what a runner without CUDA answers")
    settings.RUN_MAX_ATTEMPTS = 2
    problem = problem_from(demo_task)
    files = problem.definition["files"]
    files["reference.py"] = files["reference.py"].replace("device=DEVICE", 'device="cuda"')
    problem.save()
    leaderboard = LeaderboardFactory(problem=problem, gpu_types=[cpu_pool.cpu])
    user = UserFactory()
    code = (REPO / "problems" / "demo" / "vectoradd_py" / "solutions" / "fast.py").read_bytes()
    request = check_submission(user, leaderboard.name, ["CPU"], "test", "fast.py", code)
    with django_capture_on_commit_callbacks(execute=True):
        submission = do_submit(user, request)
    run = submission.runs.get()
    assert (run.status, run.infra_failures, run.attempt) == (RunStatus.ERROR, 1, 1)  # no retry can help
    assert run.error == "this problem needs a CUDA GPU; this runner has none"
    assert run.passed is None and run.verdict == ""
