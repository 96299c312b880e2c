"""A run's CPU share (the cpu cgroup's quota, v1 and v2) and its process count: the cgroup files written on fake
trees, the share's sizing, and real sandboxed processes (a fork bomb ended by its limit, a burner held to its quota,
the nice fallback)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from runners.harness import cgroups
from runners.harness import sandbox as sb
from runners.harness.sandbox import Limits, Sandbox

from ..conftest import require

PY = sys.executable


def _cpu_cgroup() -> str:
    """"" when runs here get a cpu cgroup, else why not."""
    try:
        return "" if cgroups.memory_parent().cpu else "no cpu controller beside the memory cgroup"
    except cgroups.CgroupUnavailable as e:
        return str(e)


@pytest.fixture
def cpu_cgroup() -> None:
    """A test that needs runs' cpu cgroups: skips with the reason where there are none, fails under CI=true."""
    require("a cpu cgroup for runs", _cpu_cgroup())


@pytest.fixture
def fake_files(monkeypatch):
    """A fake cgroup tree is plain directories: its control files are created when first written."""
    monkeypatch.setattr(cgroups, "_write", lambda path, value: Path(path).write_text(value))


def test_v2_one_group_gets_memory_pids_and_cpu_max(tmp_path: Path, fake_files):
    parent = cgroups.MemoryParent("v2", str(tmp_path), pids=str(tmp_path), cpu=str(tmp_path))
    group = parent.create(2 << 30, processes=4096, cpus=1.5)
    path = Path(group.path)
    assert group.cpu_path == group.pids_path == group.path and group._twins() == []
    assert (path / "memory.max").read_text() == str(2 << 30) and (path / "pids.max").read_text() == "4096"
    assert (path / "cpu.max").read_text() == "150000 100000" and group.cpus == 1.5
    group.kill()  # a killed tree exits at full speed
    assert (path / "cpu.max").read_text() == "max"


def test_v1_twins_in_the_pids_and_cpu_hierarchies(tmp_path: Path, fake_files):
    dirs = {name: tmp_path / name / "runner" for name in ("memory", "pids", "cpu")}
    for d in dirs.values():
        d.mkdir(parents=True)
    parent = cgroups.MemoryParent("v1", str(dirs["memory"]), pids=str(dirs["pids"]), cpu=str(dirs["cpu"]))
    group = parent.create(1 << 30, processes=64, cpus=0.25)
    name = Path(group.path).name
    assert group._twins() == [str(dirs["pids"] / name), str(dirs["cpu"] / name)]
    cpu = dirs["cpu"] / name
    assert (cpu / "cpu.cfs_period_us").read_text() == "100000" and (cpu / "cpu.cfs_quota_us").read_text() == "25000"
    assert (dirs["pids"] / name / "pids.max").read_text() == "64"
    assert (dirs["memory"] / name / "memory.limit_in_bytes").read_text() == str(1 << 30)
    (cpu / "cpu.stat").write_text("nr_periods 40\nnr_throttled 12\nthrottled_time 2500000000\n")
    assert group.cpu_stat()["nr_throttled"] == 12 and group.throttled_seconds() == 2.5
    group.unthrottle()
    assert (cpu / "cpu.cfs_quota_us").read_text() == "-1"


def test_no_cpu_controller_no_cpu_group_and_a_refused_quota_is_left_out(tmp_path: Path, fake_files, monkeypatch):
    group = cgroups.MemoryParent("v2", str(tmp_path), pids=str(tmp_path)).create(1 << 30, processes=8, cpus=2)
    assert group.cpu_path is None and group.cpus == 0 and not (Path(group.path) / "cpu.max").exists()
    assert group.cpu_stat() == {} and group.throttled_seconds() == 0

    def refuse(version: str, path: str, cpus: float) -> None:
        raise OSError(22, "Invalid argument")  # v1: above the parent's own quota

    monkeypatch.setattr(cgroups, "_set_cpu_limit", refuse)
    group = cgroups.MemoryParent("v2", str(tmp_path), cpu=str(tmp_path)).create(1 << 30, cpus=2)
    assert group.cpus == 0 and (Path(group.path) / "memory.max").exists()


@pytest.mark.parametrize("subtree, found", [("memory pids cpu", True), ("memory pids", False)])
def test_v2_cpu_groups_only_where_the_controller_is_enabled(tmp_path: Path, subtree, found):
    (tmp_path / "cgroup.subtree_control").write_text(subtree + "\n")
    assert cgroups._twin_parent("cpu", "v2", str(tmp_path), "") == (str(tmp_path) if found else None)


@pytest.mark.parametrize("cores, runs_per_node, devices, per_device, expected", [
    (2, 1, 0, 0, 1.0),  # a CPU run on a small host: one core stays the host's
    (16, 1, 1, 0, 14.0),  # one device: the node less max(1, 1/8)
    (200, 8, 1, 0, 21.88),  # torch's thread pool still has 21 cores on a big node
    (200, 8, 2, 0, 43.75),  # two devices of eight: twice the share
    (200, 8, 8, 0, 175.0),
    (200, 8, 1, 4, 4.0),  # the pool's cores per device
    (8, 1, 2, 64, 8.0),  # never more than the node has
    (1, 1, 1, 0, 1.0),
])
def test_a_runs_cpu_limit_is_its_devices_share(cores, runs_per_node, devices, per_device, expected):
    limits = Limits(runs_per_node=runs_per_node, cpus_per_device=per_device)
    assert sb.cpu_limit(limits, devices, cores) == expected


@pytest.mark.parametrize("limits, cpus, expected", [
    (Limits(), 1.0, 64), (Limits(), 21.88, 700), (Limits(processes=50), 4.0, 50), (Limits(process_count=10), 8.0, 10),
])
def test_process_count_scales_with_the_cpu_limit(limits, cpus, expected):
    assert sb.process_count_limit(limits, cpus) == expected


def test_without_a_cpu_cgroup_the_tree_runs_niced_and_says_so(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("KERNELBOT_SANDBOX", "none")
    box = Sandbox(str(tmp_path), Limits(wall_seconds=30))
    assert box.describe()["cpu"]["limit_cores"] is None
    assert box.describe()["cpu"]["bound_by"].startswith(f"nice {sb.NICE} and RLIMIT_CPU 3600 s per process only")
    o = box.start([PY, "-c", "import os; print(os.nice(0))"]).wait()
    assert o.returncode == 0 and o.stdout == f"{sb.NICE}\n", o


@pytest.mark.usefixtures("cpu_cgroup")
def test_a_run_holding_more_processes_than_its_count_is_ended(tmp_path: Path):
    """Sleeping children: far from the task limit, past the process count."""
    o = Sandbox(str(tmp_path), Limits(wall_seconds=60, process_count=10)).start([PY, "-c", textwrap.dedent("""
        import os, time
        for _ in range(20):
            if os.fork() == 0:
                time.sleep(60)
                os._exit(0)
        time.sleep(60)
    """)]).wait()
    assert o.processes_exceeded and not o.timed_out, o
    assert o.reason.startswith("process limit exceeded: the run held ") and o.reason.endswith(
        "processes at once, more than its 10, and its processes were killed"), o.reason


@pytest.mark.slow
@pytest.mark.usefixtures("cpu_cgroup")
def test_a_fork_bomb_ends_at_its_limit_with_default_limits(tmp_path: Path):
    o = Sandbox(str(tmp_path), Limits(wall_seconds=60)).start([PY, "-c", textwrap.dedent("""
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """)]).wait()
    assert o.processes_exceeded and not o.timed_out and o.reason.startswith("process limit exceeded"), o
    assert o.elapsed < 20  # the watch sees it within its 0.1 s poll; the 60 s wall limit never comes into it


@pytest.mark.slow
@pytest.mark.usefixtures("cpu_cgroup")
def test_a_thread_bomb_ends_at_the_default_task_limit(tmp_path: Path):
    """Threads are one process: the process count never sees them, the pids cgroup's 4096 tasks do."""
    o = Sandbox(str(tmp_path), Limits(wall_seconds=60)).start([PY, "-c", textwrap.dedent("""
        import threading, time
        threading.stack_size(1 << 16)
        while True:
            try:
                threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
            except RuntimeError:
                pass
    """)]).wait()
    assert o.processes_exceeded and not o.timed_out, o
    assert o.reason.startswith("process limit exceeded: the run tried to start more than 4096 processes and threads")
    assert o.elapsed < 20


@pytest.mark.slow
@pytest.mark.usefixtures("cpu_cgroup")
def test_a_cpu_burner_is_held_to_its_quota(tmp_path: Path):
    """Three processes spin for 2 s of wall time each with 3 % of a core between them, far below what the tree gets
    as one task even on a host loaded to 40 on 2 cores: the CPU time they got (their rusage) stays near 3 % of the
    wall time, and the group's cpu.stat says it was throttled."""
    box = Sandbox(str(tmp_path), Limits(wall_seconds=60))
    box.cpus = 0.03
    o = box.start([PY, "-c", textwrap.dedent("""
        import os, resource, time
        started, kids = time.monotonic(), []
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                end = time.monotonic() + 2
                while time.monotonic() < end:
                    pass
                os._exit(0)
            kids.append(pid)
        for pid in kids:
            os.waitpid(pid, 0)
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        print(used.ru_utime + used.ru_stime, time.monotonic() - started)
    """)]).wait()
    assert o.returncode == 0, o
    cpu, wall = map(float, o.stdout.split())
    assert cpu <= 0.03 * wall * 2 + 0.05, (cpu, wall)  # unlimited, three spinners take up to 2 cores' worth
    assert o.cpu_throttled_s > 0, o
