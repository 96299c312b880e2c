"""The ratio's yardstick: a submission cannot slow down the reference the parent times between its batches."""

import contextlib
import io
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from runners.harness import kernelbot
from runners.harness.job import parse_job
from runners.harness.result import Emitter

from .helpers import BENCHMARKS, SUBMISSIONS, job_for, make_workdir, run_harness

pytestmark = pytest.mark.slow


@pytest.fixture
def in_process(monkeypatch):
    """Run the trusted parent in this process; forget the problem modules it imports afterwards."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name in ("reference", "utils", "task"):
        sys.modules.pop(name, None)


def test_submission_processes_never_run_while_the_reference_is_timed(tmp_path, monkeypatch, in_process):
    windows: list[tuple[float, float]] = []
    freeze = kernelbot.SandboxTree.frozen

    @contextlib.contextmanager
    def watched(tree):
        with freeze(tree):
            start = time.monotonic()
            yield
            windows.append((start, time.monotonic()))

    monkeypatch.setattr(kernelbot.SandboxTree, "frozen", watched)
    workdir = make_workdir(tmp_path, SUBMISSIONS / "hog_reference.py")
    job = parse_job(job_for(workdir, "benchmark", timeouts={"benchmark": 120}))
    result = kernelbot.run(job, Emitter(io.StringIO()))

    assert result.verdict in ("pass", "hacked"), result.error  # hacked: its hogs' CPU time gave it away
    stamps = [float(line) for line in (workdir / "hog.log").read_text().split()]
    assert len(windows) >= 2 and stamps
    assert [t for t in stamps if any(start < t < end for start, end in windows)] == []
    assert any(windows[0][1] < t < windows[-1][0] for t in stamps)  # the hogs ran between the windows


# A process that, like the pid namespace's init under bubblewrap, adopts its orphans (a child subreaper), with a
# setsid'd, double-forked grandchild: out of the process group, still in the tree.
TREE = """import ctypes, os, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(60)
    os._exit(0)
os.wait()
time.sleep(60)
"""


def test_freeze_stops_every_process_of_the_tree_and_resumes_them():
    proc = subprocess.Popen([sys.executable, "-c", TREE], start_new_session=True)
    tree = kernelbot.SandboxTree(proc.pid)
    try:
        deadline, pids = time.monotonic() + 30, set()
        while time.monotonic() < deadline:  # one reading: the middle process may be seen just before it exits
            pids = set(tree.states())
            with contextlib.suppress(ProcessLookupError):
                if len(pids) == 2 and os.getpgid(max(pids)) != proc.pid:
                    break
            time.sleep(0.05)
        assert len(pids) == 2 and os.getpgid(max(pids)) != proc.pid
        with tree.frozen():
            assert set(tree.states().values()) == {b"T"}
        deadline = time.monotonic() + 10
        while b"T" in tree.states().values() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert b"T" not in tree.states().values()
    finally:
        for pid in tree.states():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()


def test_the_reference_and_problem_copies_live_beside_the_workdir_and_go_with_the_run(tmp_path, monkeypatch,
                                                                                       in_process):
    """The reference's child directory and the problem's snapshot are made in the run's own parent directory (a node
    agent removes it after the run, and sweeps it when a killed agent left it), not in the system's temp dir where a
    killed harness would leave them for good."""
    made, mkdtemp = [], tempfile.mkdtemp

    def recorded(*args, **kwargs):
        made.append(mkdtemp(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr("tempfile.mkdtemp", recorded)
    run_root = tmp_path / "kernelbot-run-x"
    run_root.mkdir()
    workdir = make_workdir(run_root, SUBMISSIONS / "fast.py")
    result = kernelbot.run(parse_job(job_for(workdir, "benchmark")), Emitter(io.StringIO()))

    assert result.verdict == "pass", result.error
    for prefix in ("harness-problem-", "kernelbot-reference-"):
        assert any(os.path.basename(path).startswith(prefix) for path in made), made
    assert all(os.path.dirname(path) == str(run_root) for path in made), made
    assert sorted(p.name for p in run_root.iterdir()) == ["work"]  # both removed when the run ended


def test_the_submissions_child_starts_with_the_pinned_allocator_thresholds(tmp_path):
    """Both children (the reference's is started by the same code) get glibc's malloc thresholds fixed, so whether a
    call's output comes from fresh mmap pages does not depend on what each process did before."""
    expected = kernelbot.MALLOC_ENV
    probe = tmp_path / "probe.py"
    probe.write_text(f"import os\nassert {{k: os.environ.get(k) for k in {list(expected)!r}}} == {expected!r}\n"
                     "from reference import ref_kernel as custom_kernel\n")
    result = run_harness(job_for(make_workdir(tmp_path, probe), "test"))[0]
    assert result["verdict"] == "pass", result.get("error")


# The first calls of every process that imports it take 30 ms more (a process warming up: its first allocations,
# code pages, caches); more of them than a batch has calls.
SLOW_START = """

import time as _time

_calls, _ref_kernel = 0, ref_kernel


def ref_kernel(data):
    global _calls
    _calls += 1
    if _calls <= 12:
        _time.sleep(0.03)
    return _ref_kernel(data)
"""


def test_the_references_child_is_warmed_up_as_the_submissions_is(tmp_path, in_process):
    """A process is slow at first. The submission's child gets warm-up calls before its batches; the reference's
    child gets as many, so the first batch compares two warm processes: cold, its minimum was the slow start's and
    the first batch ratio of identical code came out ~1/20 (A/A runs: 0.04-0.5), dragging the median and its interval
    down."""
    workdir = make_workdir(tmp_path, SUBMISSIONS / "fast.py")
    with open(workdir / "reference.py", "a") as f:
        f.write(SLOW_START)
    (workdir / "submission.py").write_text("from reference import ref_kernel as custom_kernel\n")
    timing = {"rel_ci": 0.01, "min_samples": 10, "max_samples": 300, "case_budget_s": 0.5, "warmup_s": 0.5}
    job = job_for(workdir, "benchmark", timing=timing, benchmarks=BENCHMARKS[:1])
    result = kernelbot.run(parse_job(job), Emitter(io.StringIO()))

    assert result.verdict == "pass", result.error
    first = result.benchmarks[0].batches[0]
    assert first[0] < 20e6 and first[1] < 20e6, first  # neither side's minimum is a slow start's 30 ms
    assert all(0.2 < sub / ref < 5 for sub, ref, *_ in result.benchmarks[0].batches), result.benchmarks[0].batches
