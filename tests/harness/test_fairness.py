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

from .helpers import SUBMISSIONS, job_for, make_workdir, run_harness

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
        deadline = time.monotonic() + 30
        while len(tree.states()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = set(tree.states())
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
