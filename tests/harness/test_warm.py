"""The warm harness (runners.harness.warm, runner.Spares): each run's trusted parent is forked from a template that
imported torch once, and a spare parent per device slot starts its sandboxed child before its run exists. Verdicts
are the same as a cold start's, a dead template is replaced, and a spare is a fresh sandbox: nothing of the run before
(files, processes) reaches the next one."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runners.harness.runner import Spares, harness_env, new_workdir, run_harness, start_harness
from runners.harness.sandbox import Limits, Sandbox
from runners.harness.warm import Template

from .helpers import FIXTURES, ROOT, SUBMISSIONS, job_for

pytestmark = pytest.mark.slow

MARK = "kernelbot-warm-test-mark"
# Run 1 leaves what it can: files in its workdir, its /tmp and /dev/shm, and a detached process named after the mark.
LEAVE_TRACES = f"""
import os, subprocess, sys
for path in ("left.txt", "/tmp/left.txt", "/dev/shm/left.txt"):
    try:
        open(path, "w").write("{MARK}")
    except OSError:
        pass
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{MARK}"], start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
from submission_base import custom_kernel
"""
# Run 2 fails if it finds any of them.
FIND_TRACES = f"""
import os
seen = [p for p in ("left.txt", "/tmp/left.txt", "/dev/shm/left.txt") if os.path.exists(p)]
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if b"{MARK}" in open(f"/proc/{{pid}}/cmdline", "rb").read():
            seen.append(f"process {{pid}}")
    except OSError:
        pass
if seen:
    raise RuntimeError(f"traces of the run before: {{seen}}")
from submission_base import custom_kernel
"""


def files_for(submission: str) -> dict[Path, bytes]:
    problem = FIXTURES / "matmul"
    files = {p.relative_to(problem): p.read_bytes() for p in problem.rglob("*") if p.is_file()}
    return {**files, Path("submission_base.py"): (SUBMISSIONS / "fast.py").read_bytes(),
            Path("submission.py"): submission.encode()}


def write(workdir: Path, files: dict[Path, bytes]) -> None:
    for name, data in files.items():
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).write_bytes(data)


def run(job: dict, **kwargs) -> dict:
    result, failure = run_harness(job, python=sys.executable, pythonpath=str(ROOT), timeout=180,
                                  on_progress=lambda event: None, still_wanted=lambda: True, check_interval=2, **kwargs)
    assert result is not None, failure
    return result


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def descendants(pid: int) -> list[int]:
    try:
        children = [int(c) for t in os.listdir(f"/proc/{pid}/task")
                    for c in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]
    except OSError:
        return []
    return [pid for child in children for pid in (child, *descendants(child))]


def runs_child_script(pid: int) -> bool:
    try:
        return b"_harness_child.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def interprets_child_script(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:2] == [b"_harness_child.py"]
    except OSError:
        return False


def wait_for(predicate, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_parents_forked_from_one_template_give_cold_verdicts_and_a_dead_template_is_replaced(tmp_path):
    template = Template(sys.executable, str(ROOT))
    try:
        verdicts = {}
        for name in ("fast.py", "wrong.py"):
            workdir = tmp_path / name / "work"
            shutil.copytree(FIXTURES / "matmul", workdir)
            shutil.copyfile(SUBMISSIONS / name, workdir / "submission.py")
            proc = template.spawn(harness_env(str(workdir), str(ROOT)), str(ROOT))
            assert parent_of(proc.pid) == template.proc.pid  # forked from the template, not a new interpreter
            result = run(job_for(workdir, "test"), proc=proc)
            verdicts[name] = result["verdict"]
            assert result["runner_timing"]["parent"] == "spare"  # (a parent handed in: run_harness did not start it)
        assert verdicts == {"fast.py": "pass", "wrong.py": "fail"}

        waiting = template.spawn(harness_env(str(tmp_path), str(ROOT)), str(ROOT))
        first = template.proc.pid
        os.kill(first, signal.SIGKILL)
        assert waiting.wait(30) == -signal.SIGKILL  # its parents die with it, and say so
        again = template.spawn(harness_env(str(tmp_path), str(ROOT)), str(ROOT))
        assert template.proc.pid != first and parent_of(again.pid) == template.proc.pid
        again.kill()
        assert again.wait(30) == -signal.SIGKILL
    finally:
        template.close()


def test_a_spare_starts_its_child_before_the_job_and_serves_only_a_job_of_its_shape(tmp_path):
    spares = Spares(sys.executable, str(ROOT), tmp_path)
    try:
        spares.prepare((), job_for(Path("/unused"), "leaderboard", limits={"processes": 64}))
        spare = spares.take(())
        # before any job exists, the spare's sandboxed interpreter is running (under bwrap or not)
        wait_for(lambda: any(runs_child_script(pid) for pid in descendants(spare.proc.pid)))
        write(spare.workdir, files_for((SUBMISSIONS / "fast.py").read_text()))
        result = run(job_for(spare.workdir, "test", limits={"processes": 64}), proc=spare.proc)
        assert (result["verdict"], result["child_start"], result["runner_timing"]["parent"]) == (
            "pass", "prestarted", "spare")

        spares.prepare((), job_for(Path("/unused"), "test", limits={"processes": 64}))
        spare = spares.take(())
        write(spare.workdir, files_for((SUBMISSIONS / "fast.py").read_text()))
        other_shape = job_for(spare.workdir, "test", limits={"processes": 96})
        result = run(other_shape, proc=spare.proc)
        assert (result["verdict"], result["child_start"]) == ("pass", "cold")

        spares.prepare((), {"mode": "test", "protocol": "popcorn"})  # no child to start early: no spare
        assert spares.take(()) is None
    finally:
        spares.close()


def test_a_leaderboard_spare_starts_the_reference_child_ahead_too_and_a_test_run_ends_it(tmp_path):
    """Issue 49: the reference's own child is the spare's too, so a ranked run does not wait for its interpreter and
    torch; a run that times nothing ends it with the run, leaving no directory behind."""
    spares = Spares(sys.executable, str(ROOT), tmp_path)
    try:
        for mode, started in (("leaderboard", "prestarted"), ("test", None)):
            spares.prepare((), job_for(Path("/unused"), "leaderboard"))
            spare = spares.take(())
            pid = spare.proc.pid  # two interpreters run the child script (bwrap's command lines name it too)
            wait_for(lambda pid=pid: sum(map(interprets_child_script, descendants(pid))) == 2)
            write(spare.workdir, files_for((SUBMISSIONS / "fast.py").read_text()))
            result = run(job_for(spare.workdir, mode), proc=spare.proc)
            assert (result["verdict"], result["child_start"], result.get("reference_start")) == (
                "pass", "prestarted", started)
            assert list(spare.workdir.parent.glob("kernelbot-reference-*")) == []
        workdir = new_workdir(tmp_path)
        write(workdir, files_for((SUBMISSIONS / "fast.py").read_text()))
        assert run(job_for(workdir, "leaderboard"))["reference_start"] == "cold"  # no spare: as before
    finally:
        spares.close()


def test_the_reference_child_runs_the_problem_as_it_was_before_the_submission_ran(tmp_path):
    """The submission's child may write to its directory: the reference's child takes the problem's files from the
    snapshot made before the submission was imported, so a slowed-down reference.py does not flatter the ratio."""
    slow_reference = (b"\nimport time as _t\n_ref = ref_kernel\n\n\ndef ref_kernel(data):\n    _t.sleep(0.005)\n"
                      b"    return _ref(data)\n")
    code = (f"from submission_base import custom_kernel\nwith open('reference.py', 'ab') as f:\n"
            f"    f.write({slow_reference!r})\n")
    for spare in (Spares(sys.executable, str(ROOT), tmp_path), None):
        if spare is not None:
            spare.prepare((), job_for(Path("/unused"), "benchmark"))
            taken = spare.take(())
        workdir = taken.workdir if spare is not None else new_workdir(tmp_path)
        write(workdir, files_for(code))
        try:
            result = run(job_for(workdir, "benchmark", benchmarks=[{"m": 64, "n": 64, "k": 64, "seed": 11}]),
                         proc=taken.proc if spare is not None else None)
        finally:
            if spare is not None:
                spare.close()
        assert result["verdict"] == "pass", result.get("error")
        assert (workdir / "reference.py").read_bytes().endswith(slow_reference)  # the write happened
        assert result["benchmarks"][0]["ratio"] > 0.5, result["benchmarks"][0]


def test_a_spare_is_a_fresh_sandbox_nothing_of_the_run_before_reaches_it(tmp_path):
    spares = Spares(sys.executable, str(ROOT), tmp_path)
    try:
        verdicts = []
        for code in (LEAVE_TRACES, FIND_TRACES):
            spare = spares.take(())
            workdir = spare.workdir if spare else new_workdir(tmp_path)
            write(workdir, files_for(code))
            job = job_for(workdir, "test")
            result = run(job, proc=spare.proc if spare else None, warm=True)
            verdicts.append((result["verdict"], result.get("child_start"), result.get("error", "")[-300:]))
            shutil.rmtree(workdir.parent)
            spares.prepare((), job)
        assert verdicts[0][0] == "pass"
        assert verdicts[1][:2] == ("pass", "prestarted"), verdicts[1]
        leftovers = subprocess.run(["pgrep", "-f", MARK], capture_output=True, text=True).stdout.split()
        assert leftovers == [], "a process of the first run outlived it"
    finally:
        spares.close()


def test_a_spare_child_s_wall_clock_starts_with_its_run(tmp_path):
    sandbox = Sandbox(str(tmp_path), Limits(wall_seconds=0.5))
    proc = sandbox.start([sys.executable, "-c", "import time; time.sleep(30)"], clock=False)
    try:
        time.sleep(1.5)  # idle past the limit: a spare waiting for its run is not timed out
        assert proc.proc.poll() is None
        proc.restart_clock(Limits(wall_seconds=0.5))
        outcome = proc.wait()
        assert outcome.timed_out and "wall time exceeded (0.5 s)" in outcome.reason
    finally:
        proc.kill()


def test_start_harness_cold_and_warm_both_take_a_job_on_stdin(tmp_path):
    workdir = tmp_path / "work"
    shutil.copytree(FIXTURES / "matmul", workdir)
    shutil.copyfile(SUBMISSIONS / "fast.py", workdir / "submission.py")
    for warm, start in ((False, "spawned"), (True, "forked")):
        result = run(job_for(workdir, "test"), warm=warm)
        assert (result["verdict"], result["runner_timing"]["parent"]) == ("pass", start)
    proc = start_harness(str(workdir), python=sys.executable, pythonpath=str(ROOT), warm=True)
    assert run(job_for(workdir, "test"), proc=proc)["verdict"] == "pass"


def test_a_spare_makes_device_contexts_ahead_only_while_no_reservation_holds_its_devices(tmp_path):
    spares = Spares(sys.executable, str(ROOT), tmp_path)
    job = job_for(Path("/unused"), "test")
    try:
        spares.prepare(("0",), job)
        warm = spares.ready[("0",)]
        assert warm.warm
        spares.reserve(["1"])  # another slot's device: this spare keeps its contexts
        assert spares.ready[("0",)] is warm
        spares.reserve(["0"])  # a reservation takes its device: replaced by a spare that holds none
        cold = spares.ready[("0",)]
        assert cold is not warm and not cold.warm and cold.proc.pid != warm.proc.pid
        assert warm.proc.wait(10) is not None and not warm.workdir.exists()
        spares.prepare(("0",), job)  # a run on the slot ends while the reservation still holds it
        assert not spares.ready[("0",)].warm
        spares.reserve([])
        spares.prepare(("0",), job)
        assert spares.ready[("0",)].warm
    finally:
        spares.close()


@pytest.mark.slow
def test_no_spare_holds_device_contexts_on_a_device_a_run_of_another_slot_uses(tmp_path):
    """Issue 41: a two-device run covers the single-device slots' devices: their spares' contexts and flush buffers
    go while it runs (replaced by spares that make none) and come back when it ends."""
    spares = Spares(sys.executable, str(ROOT), tmp_path)
    job = job_for(Path("/unused"), "test")
    try:
        spares.prepare(("0",), job)
        spares.prepare(("1",), job)
        spares.prepare(("2",), job)
        before = {slot: spare for slot, spare in spares.ready.items()}
        assert all(spare.warm for spare in before.values())
        assert spares.take(("0", "1")) is None  # no spare of that shape yet: the run starts its own parent
        assert not spares.ready[("0",)].warm and not spares.ready[("1",)].warm
        assert spares.ready[("2",)] is before[("2",)]  # another device: kept
        assert before[("0",)].proc.wait(10) is not None and before[("1",)].proc.wait(10) is not None
        spares.prepare(("0", "1"), job)  # the run ended: every slot warm again
        assert all(spares.ready[slot].warm for slot in [("0",), ("1",), ("2",), ("0", "1")])
        taken = spares.take(("0",))  # a one-device run: the two-device slot's spare lets go of device 0
        assert taken is not None and taken.warm and not spares.ready[("0", "1")].warm
        Spares.discard(taken)
    finally:
        spares.close()


def test_a_run_says_where_its_seconds_went(tmp_path):
    """The breakdown each result carries (what bench/gpu.py prints): phases in order, with the child's own account."""
    workdir = tmp_path / "work"
    shutil.copytree(FIXTURES / "matmul", workdir)
    shutil.copyfile(SUBMISSIONS / "fast.py", workdir / "submission.py")
    result = run(job_for(workdir, "leaderboard"))
    seconds = result["seconds"]
    assert list(seconds) == ["parent_start", "child_start", "device_context", "problem_load", "child_ready",
                             "calibrate", "submission_import", "tests", "reference_start", "benchmark", "ranked",
                             "teardown"]
    # each phase measures what it is named for: waiting for the child's torch import is the child's start, never
    # the calibration's (issue 41: calibrate held the whole import while child_start said 0.0008 s)
    boot = seconds["child_start"] + seconds["device_context"] + seconds["problem_load"] + seconds["child_ready"]
    assert boot >= result["child_seconds"]["torch_import"]
    assert all(v >= 0 for v in seconds.values()) and seconds["benchmark"] > 0 and seconds["ranked"] > 0
    assert sum(seconds.values()) <= result["runner_timing"]["harness_s"] + 0.05
    assert set(result["seconds_of"]) == {"generate", "check", "lend"}
    assert result["seconds_of"]["generate"] > 0 and result["seconds_of"]["check"] > 0
    assert set(result["child_seconds"]) == {"torch_import", "submission_import"}  # CPU: no device context
    assert result["child_start"] == "cold" and result["device_context"] == "none"
