"""An out-of-memory error is blamed from facts (issues 34 and 41): it is one by torch's error type, never by words a
submission can print; whose fault it is comes from the device's memory measured by the parent when it happened, the
child still alive: the device's when other processes held enough to explain it (an infrastructure failure the
platform retries, the holders named), the submission's when its own processes held it or it asked for more than the
device has, the problem's only when its own code failed on a device otherwise empty, and "unknown" (charged to no one,
tried once more) where nothing measures the device. Others' memory counts only from max(1 GiB, 5 % of the device);
what the child says (that it ran out, the size it asked) never moves the verdict towards the device or "unknown", and
where the parent has no CUDA device its claim is ignored (a plain fail). The errors are those torch's CUDA allocator
raises, injected on CPU; the device's memory comes from a stand-in nvidia-smi (or rocm-smi) on PATH, or a stand-in
for torch's device-wide figures in the parent."""

import json
import os
import stat
import sys
import threading
from types import SimpleNamespace

import pytest

from runners.harness import device, kernelbot
from runners.harness.result import PROBLEM_ERROR_FLAG

from .helpers import FIXTURES, SUBMISSIONS, job_for, make_workdir, run_harness

TOTAL_MIB = 81_091  # 79.19 GiB, as torch's message below says
MESSAGE = ("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.50 GiB "
           "is free. Of the allocated memory 2.1 GiB is allocated by PyTorch")
OOM = f"torch.OutOfMemoryError({MESSAGE!r})"
HUGE = ("torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 200.00 GiB. GPU 0 has a total capacity of "
        "79.19 GiB of which 78.50 GiB is free.')")
GENERATE_OOM = f"\ndef generate_input(m, n, k, seed):\n    import torch\n    raise {OOM}\n"
KERNEL_OOM = f"import torch\n\n\ndef custom_kernel(data):\n    raise {OOM}\n"
IMPORT_OOM = f"import torch\n\nraise {OOM}\n"
KERNEL_HUGE = f"import torch\n\n\ndef custom_kernel(data):\n    raise {HUGE}\n"
WORDS_ONLY = f"def custom_kernel(data):\n    raise ValueError({MESSAGE!r})\n"
PRINTS_WORDS = ("import sys\n\n\ndef custom_kernel(data):\n    print('torch.OutOfMemoryError: ' + "
                f"{MESSAGE!r}, file=sys.stderr)\n    sys.exit(1)\n")

SMI = """#!{python}
# A stand-in nvidia-smi: one device of {total} MiB; `others` (pid, MiB) hold memory on it, and the calling harness's
# child (its parent's other child process) holds {child} MiB.
import os, sys
BUS = "00000000:01:00.0"
if sys.argv[1].startswith("--query-gpu="):
    fields = {{"index": "0", "pci.bus_id": BUS, "memory.total": "{total}", "mig.mode.current": "{mig}"}}
    print(", ".join(fields[name] for name in sys.argv[1].split("=", 1)[1].split(",")))
elif sys.argv[1].startswith("--query-compute-apps="):
    rows = {others!r}
    if {child}:
        me, parent = os.getpid(), os.getppid()
        for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me):
            try:
                with open(f"/proc/{{pid}}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == parent:
                        rows.append((pid, {child}))
                        break
            except (OSError, ValueError, IndexError):
                pass
    for pid, used in rows:
        print(f"{{pid}}, {{used}}, {{BUS}}")
"""


@pytest.fixture
def smi(tmp_path, monkeypatch):
    """Install a stand-in nvidia-smi on PATH: smi(others=[(pid, MiB)], child=MiB, total=MiB)."""
    def install(others=(), child=0, total=TOTAL_MIB, mig="[N/A]"):
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        tool = bin_dir / "nvidia-smi"
        tool.write_text(SMI.format(python=sys.executable, total=total, others=list(others), child=child, mig=mig))
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return install


@pytest.fixture
def holder(smi):
    """Another user's training job, as far as the run is concerned (this test process: not the run's parent or any
    of its descendants), holding 70,000 MiB of the device."""
    smi(others=[(os.getpid(), 70000)])
    return os.getpid()


@pytest.fixture
def small_holder(smi):
    smi(others=[(os.getpid(), 1)])  # 1 MiB: a monitoring tool's context, say
    return os.getpid()


@pytest.fixture
def no_tool(monkeypatch):
    """No nvidia-smi, amd-smi nor rocm-smi to be found (this machine has none; a stray one on PATH would not be
    asked)."""
    monkeypatch.setenv("PATH", os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                               if not any(os.path.exists(os.path.join(p, t))
                                                          for t in ("nvidia-smi", "amd-smi", "rocm-smi"))))


def test_torchs_message_gives_the_figures():
    said = device.figures("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB "
                          "of which 1.50 GiB is free. Including non-PyTorch memory, this process has 2 GiB")
    assert (said.asked, said.free, said.total) == (20 << 30, int(1.5 * (1 << 30)), int(79.19 * (1 << 30)))
    assert said.describe() == "asked 20,480 MiB, free 1,536 MiB, total 81,091 MiB"


def test_out_of_memory_is_torchs_error_type_not_its_words():
    import torch

    assert device.oom_raised(torch.OutOfMemoryError("x")) and device.oom_raised(torch.cuda.OutOfMemoryError("x"))
    try:
        try:
            raise torch.OutOfMemoryError("x")
        except RuntimeError as exc:
            raise ValueError("wrapped") from exc
    except ValueError as exc:
        assert device.oom_raised(exc)
    assert not device.oom_raised(ValueError(MESSAGE)) and not device.oom_raised(RuntimeError("CUDA out of memory"))


def test_the_measure_splits_the_run_from_other_processes(holder):
    memory = device.measure([], run_pid=1)  # as a run's parent sees another process's memory
    assert memory is not None and memory.total == TOTAL_MIB << 20 and memory.source == "nvidia-smi"
    assert [(h.pid, h.memory >> 20, h.device) for h in memory.others] == [(holder, 70000, "0")]
    mine = device.measure([])  # this process and its descendants are the run
    assert mine is not None and mine.others == [] and mine.held() == 70000 << 20
    assert device.measure(["1"], run_pid=1) is None  # another device: nothing measured


def memory(total=80_000, parent=0, child=0, others=0, unplaced=0, per_process=True):
    own = [device.Holder(10, "k", parent << 20, "0")] + ([device.Holder(11, "k", child << 20, "0")] if child else [])
    foreign = [device.Holder(99, "x", others << 20, "0")] if others else []
    return device.Memory("nvidia-smi", total << 20, 10, own, foreign, unplaced << 20, per_process)


@pytest.mark.parametrize(("measured", "asked", "where", "who"), [
    (None, 20 << 30, "submission", "unknown"),  # nothing measured
    (memory(others=1, child=2_000), 20 << 30, "submission", "submission"),  # a 1 MiB holder explains nothing
    (memory(others=1, child=79_999), None, "submission", "submission"),  # ... even to one that filled the device
    (memory(others=900, child=79_100), None, "submission", "submission"),  # under 1 GiB: nobody's fault but its own
    (memory(others=3_000, child=77_000), None, "submission", "submission"),  # under 5 % of the device
    (memory(others=8_000, child=72_000), None, "submission", "device"),  # 10 %, and the device full
    (memory(others=20_000, child=2_000), 70 << 30, "submission", "submission"),  # a size it wrote: 58 GiB were free
    (memory(others=70_000, child=2_000), 20 << 30, "submission", "device"),  # without them it fitted
    (memory(others=1, child=2_000), 200 << 30, "submission", "submission"),  # more than the device has
    (memory(others=70_000, child=2_000), 200 << 30, "submission", "submission"),  # ... even beside a big holder
    (memory(others=1, child=78_000), 20 << 30, "submission", "submission"),  # its own processes held it
    (memory(others=1, child=78_000, parent=500), 20 << 30, "problem", "submission"),  # the child held it
    (memory(others=70_000, child=500, parent=500), 20 << 30, "problem", "device"),
    (memory(others=1, child=500, parent=500), 20 << 30, "problem", "problem"),  # otherwise empty
    (memory(others=1, child=500, parent=500), 200 << 30, "problem", "problem"),
    (memory(others=60_000, child=500), None, "submission", "device"),  # size unknown: others held over half
    (memory(others=1_000, child=500), None, "submission", "submission"),
    (memory(unplaced=70_000, child=500), 20 << 30, "submission", "unknown"),  # a container's host pids
    (memory(others=70_000, per_process=False), 20 << 30, "submission", "unknown"),  # device-wide figures only
    (memory(others=500, per_process=False), 70 << 30, "submission", "submission"),  # ... 500 MiB used: its own
    (memory(per_process=False), 200 << 30, "submission", "submission"),
])
def test_blame_follows_the_measured_memory(measured, asked, where, who):
    assert device.blame(measured, asked, where).who == who


class Child:
    """A ChildSession's child as the parent's out-of-memory judgment meets it: alive until killed."""

    def __init__(self):
        self.killed = False
        self.waiter = threading.Thread(target=lambda: None)
        self.waiter.start()

    def kill(self) -> None:
        self.killed = True


def session_on(monkeypatch, *, cuda=True, measured=None, device_used=(None, None), parent=500):
    """The run's parent's view of its child's out-of-memory error: torch with or without a CUDA device, what the
    driver's tool measures (a Memory, or None: no tool), torch's device-wide free memory before and after the child is
    ended (MiB used; None: torch cannot say), and the parent's own use (MiB)."""
    import torch

    child = Child()
    total = 80_000 << 20

    def mem_get_info():
        used = device_used[child.killed]
        if used is None:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return total - (used << 20), total

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i=0: parent << 20)
    monkeypatch.setattr(device, "measure", lambda devices, run_pid=None: measured)
    session = kernelbot.ChildSession.__new__(kernelbot.ChildSession)
    session.job, session.proc, session.waiter = SimpleNamespace(gpus=()), child, child.waiter
    return session, child


@pytest.mark.parametrize(("measured", "message", "who"), [
    (memory(others=70_000, child=2_000), MESSAGE, "device"),
    (memory(others=1, child=79_999), "CUDA out of memory.", "submission"),  # allocated until it ran out
    (memory(others=20_000), MESSAGE.replace("20.00 GiB", "70.00 GiB"), "submission"),  # raised it, 60 GiB free
    (memory(others=70_000, child=2_000), MESSAGE.replace("20.00 GiB", "5.00 GiB"), "submission"),  # fitted
])
def test_the_childs_oom_on_a_gpu_node_is_judged_from_measured_memory(monkeypatch, measured, message, who):
    session, child = session_on(monkeypatch, measured=measured)
    assert session.judge_oom(message).who == who and not child.killed  # the figures were per process


def test_the_childs_oom_claim_on_a_node_without_cuda_is_ignored(monkeypatch):
    session, _ = session_on(monkeypatch, cuda=False, measured=memory(others=70_000))
    assert session.judge_oom(MESSAGE) is None


@pytest.mark.parametrize(("device_used", "who", "child_mib", "others_mib"), [
    ((78_000, 2_000), "submission", 76_000, 1_500),  # the child's end freed 76 GiB: its own
    ((78_000, 70_000), "device", 8_000, 69_500),  # others still hold 69.5 GiB
    ((78_000, None), "unknown", None, None),  # torch cannot say after: nothing apportions it
    ((None, None), "unknown", None, None),  # nothing measures the device at all
])
def test_device_wide_figures_are_apportioned_by_ending_the_child(monkeypatch, device_used, who, child_mib,
                                                                 others_mib):
    """Where only torch's device-wide figures exist, the parent measures the device's use before and after it ends
    the child: what the child's end freed was its share; the rest, less the parent's own, other processes'."""
    session, child = session_on(monkeypatch, device_used=device_used)
    judged = session.judge_oom(MESSAGE)
    assert judged.who == who and child.killed == (device_used[0] is not None)
    if child_mib is not None:
        assert (judged.memory.held(child=True) >> 20, judged.memory.foreign() >> 20) == (child_mib, others_mib)


def test_a_containers_unplaced_memory_is_apportioned_too(monkeypatch):
    """nvidia-smi in a container names host pids this host cannot place, the child's among them: the device's use
    before and after the child ends says what was the child's."""
    session, child = session_on(monkeypatch, measured=memory(unplaced=79_000))
    monkeypatch.setattr(device, "used", lambda devices: (79_500 if not child.killed else 1_000) << 20)
    judged = session.judge_oom("CUDA out of memory.")
    assert child.killed and judged.who == "submission" and judged.memory.held(child=True) == 78_500 << 20


ROCM = """#!/bin/sh
case "$*" in
  *showmeminfo*) echo '{{"card0": {{"VRAM Total Memory (B)": "{total}", "VRAM Total Used Memory (B)": "1"}}}}' ;;
  *showpids*) echo '{{"system": {{"PID{pid}": "python3, 1, {used}, 0, 0"}}}}' ;;
esac
"""


def test_rocm_smi_is_asked_where_nvidia_smi_is_missing(tmp_path, monkeypatch, no_tool):
    bin_dir = tmp_path / "rocm"
    bin_dir.mkdir()
    tool = bin_dir / "rocm-smi"
    tool.write_text(ROCM.format(total=64 << 30, pid=os.getpid(), used=40 << 30))
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    memory = device.measure([], run_pid=1)
    assert memory is not None and (memory.source, memory.total) == ("rocm-smi", 64 << 30)
    assert [(h.pid, h.memory) for h in memory.others] == [(os.getpid(), 40 << 30)]
    assert device.blame(memory, 30 << 30, "submission").who == "device"


@pytest.mark.parametrize(("mig", "used"), [("Enabled", 70000), ("Enabled", "[N/A]"), ("[N/A]", "[N/A]"),
                                         ("Disabled", "[Not Supported]")])
def test_a_mig_slice_or_unknown_process_memory_claims_no_process_figures(smi, mig, used):
    """On a MIG slice nvidia-smi gives no process's memory (and the whole GPU's totals): nothing per process is
    claimed, so the parent falls back to torch's figures for its slice (apportioned) or "unknown"."""
    smi(others=[(os.getpid(), used)], mig=mig)
    assert device.measure([], run_pid=1) is None


def test_on_a_mig_slice_the_parent_apportions_torchs_figures(monkeypatch, smi):
    smi(others=[(os.getpid(), "[N/A]")], mig="Enabled")
    measure = device.measure
    session, child = session_on(monkeypatch, device_used=(78_000, 70_000))
    monkeypatch.setattr(device, "measure", measure)
    judged = session.judge_oom(MESSAGE)
    assert child.killed and judged.memory.source.startswith("torch") and judged.who == "device"


AMD = """#!/bin/sh
case "$*" in
  *metric*) echo '{metric}' ;;
  *process*) echo '{process}' ;;
esac
"""


def amd_smi(tmp_path, monkeypatch, *, total_mb, used_mb, processes, wrapped=False, nested=True):
    """A stand-in amd-smi on PATH: one device; `processes` (pid, bytes) on it."""
    entries = [{"process_info": p} if nested else p for p in (
        {"name": "python3", "pid": pid, "memory_usage": {"gtt_mem": {"value": 0, "unit": "B"},
                                                         "vram_mem": {"value": used, "unit": "B"}}}
        for pid, used in processes)] or [{"process_info": "No running processes detected"}]
    metric = [{"gpu": 0, "mem_usage": {"total_vram": {"value": total_mb, "unit": "MB"},
                                       "used_vram": {"value": used_mb, "unit": "MB"}}}]
    process = [{"gpu": 0, "process_list": entries}]
    if wrapped:
        metric, process = {"gpu_data": metric}, {"gpu_data": process}
    bin_dir = tmp_path / "amd"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "amd-smi"
    tool.write_text(AMD.format(metric=json.dumps(metric), process=json.dumps(process)))
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize(("wrapped", "nested"), [(False, True), (True, False)], ids=["rocm6", "rocm7"])
def test_amd_smi_is_asked_before_rocm_smi(tmp_path, monkeypatch, no_tool, wrapped, nested):
    rocm = tmp_path / "rocm"
    rocm.mkdir()
    (rocm / "rocm-smi").write_text(ROCM.format(total=32 << 30, pid=1, used=1))
    (rocm / "rocm-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{rocm}{os.pathsep}{os.environ['PATH']}")
    amd_smi(tmp_path, monkeypatch, total_mb=65536, used_mb=41000, processes=[(os.getpid(), 40 << 30)],
            wrapped=wrapped, nested=nested)
    memory = device.measure([], run_pid=1)
    assert memory is not None and (memory.source, memory.total, memory.per_process) == ("amd-smi", 64 << 30, True)
    assert [(h.pid, h.memory, h.device) for h in memory.others] == [(os.getpid(), 40 << 30, "0")]
    assert device.blame(memory, 30 << 30, "submission").who == "device"
    assert device.used([]) == 41000 << 20 and device.used(["1"]) is None
    mine = device.measure([])  # this process is the run
    assert mine is not None and mine.others == [] and mine.held() == 40 << 30


def test_amd_smi_without_processes_or_figures(tmp_path, monkeypatch, no_tool):
    amd_smi(tmp_path, monkeypatch, total_mb=65536, used_mb=10, processes=[])
    memory = device.measure([], run_pid=1)
    assert memory is not None and memory.others == [] and memory.own == []
    amd_smi(tmp_path, monkeypatch, total_mb=65536, used_mb=10, processes=[(os.getpid(), "N/A")])
    assert device.measure([], run_pid=1) is None  # a process whose memory is not given: no share claimed


def workdir_with(tmp_path, submission: str | None = None, reference_patch: str = ""):
    workdir = make_workdir(tmp_path, SUBMISSIONS / "fast.py")
    if submission is not None:
        (workdir / "submission.py").write_text(submission)
    (workdir / "reference.py").write_text((FIXTURES / "matmul" / "reference.py").read_text() + reference_patch)
    return workdir


@pytest.mark.slow
@pytest.mark.parametrize(("submission", "prefix"), [
    (KERNEL_OOM, "custom_kernel raised"), (IMPORT_OOM, "the submission could not be imported"),
    (KERNEL_HUGE, "custom_kernel raised")], ids=["kernel", "import", "huge"])
@pytest.mark.parametrize("held", ["full", "small", "nothing"])
def test_on_a_node_without_cuda_the_childs_oom_is_its_own_fail(tmp_path, smi, no_tool, submission, prefix, held):
    """No real CUDA out-of-memory error can happen where the run's parent has no CUDA device: the child's claim (its
    own to raise) is a plain fail charged to it, whatever a driver's tool says others hold or whether one answers."""
    if held != "nothing":
        smi(others=[(os.getpid(), 70000 if held == "full" else 1)])
    result, _ = run_harness(job_for(workdir_with(tmp_path, submission), "test"))
    assert (result["status"], result["verdict"]) == ("ok", "fail"), result["error"]
    assert device.DEVICE_BUSY_FLAG not in result["flags"] and device.OOM_UNKNOWN_FLAG not in result["flags"]
    assert result["error"].startswith(f"{prefix}: ") and "OutOfMemoryError" in result["error"]


@pytest.mark.slow
def test_words_alone_are_no_out_of_memory_error(tmp_path, small_holder):
    result, _ = run_harness(job_for(workdir_with(tmp_path, WORDS_ONLY), "test"))
    assert (result["status"], result["verdict"]) == ("ok", "fail") and device.DEVICE_BUSY_FLAG not in result["flags"]
    assert result["error"].startswith("custom_kernel raised: ") and "out of device memory" not in result["error"]
    assert "ValueError: CUDA out of memory" in result["error"]


@pytest.mark.slow
def test_the_problems_oom_on_a_full_device_is_the_devices_fault(tmp_path, holder):
    result, _ = run_harness(job_for(workdir_with(tmp_path, reference_patch=GENERATE_OOM), "test"))
    assert result["status"] == "error" and device.DEVICE_BUSY_FLAG in result["flags"]
    assert PROBLEM_ERROR_FLAG not in result["flags"] and result["device_holders"][0]["pid"] == holder


@pytest.mark.slow
def test_the_problems_oom_while_the_submissions_child_holds_the_device_is_the_submissions(tmp_path, smi):
    smi(child=78_000)  # measured before the child is killed: its memory is the cause
    result, _ = run_harness(job_for(workdir_with(tmp_path, reference_patch=GENERATE_OOM), "test"))
    assert (result["status"], result["verdict"]) == ("ok", "fail")
    assert PROBLEM_ERROR_FLAG not in result["flags"] and device.DEVICE_BUSY_FLAG not in result["flags"]
    assert result["error"].startswith("the submission's processes held the device's memory when the problem's own "
                                      "code ran out of it (generate_input): ")
    assert result["device_memory"]["run_mib"] == 78_000


@pytest.mark.slow
def test_the_problems_oom_beside_an_unrelated_small_holder_is_a_problem_error(tmp_path, small_holder):
    result, _ = run_harness(job_for(workdir_with(tmp_path, reference_patch=GENERATE_OOM), "test"))
    assert result["status"] == "error" and PROBLEM_ERROR_FLAG in result["flags"]
    assert device.DEVICE_BUSY_FLAG not in result["flags"]
    assert result["error"].startswith("the problem's own code failed: generate_input: OutOfMemoryError: ")
    assert result["error"].endswith("other processes 1 MiB, asked 20,480 MiB; no other process held enough to "
                                    "explain it)")


@pytest.mark.slow
def test_the_problems_oom_nothing_can_measure_is_no_problem_error(tmp_path, no_tool):
    result, _ = run_harness(job_for(workdir_with(tmp_path, reference_patch=GENERATE_OOM), "test"))
    assert result["status"] == "error" and device.OOM_UNKNOWN_FLAG in result["flags"]
    assert PROBLEM_ERROR_FLAG not in result["flags"]


def popcorn_workdir(tmp_path, submission):
    workdir = workdir_with(tmp_path, submission)
    (workdir / "eval.py").write_text((FIXTURES / "popcorn" / "eval.py").read_text())
    return workdir


@pytest.mark.slow
def test_an_oom_under_the_popcorn_protocol_on_a_full_device_is_the_devices_fault(tmp_path, holder):
    result, _ = run_harness(job_for(popcorn_workdir(tmp_path, KERNEL_OOM), "test", protocol="popcorn"))
    assert result["status"] == "error" and device.DEVICE_BUSY_FLAG in result["flags"]
    assert result["device_holders"][0]["pid"] == holder


@pytest.mark.slow
@pytest.mark.parametrize("submission", [KERNEL_OOM, PRINTS_WORDS], ids=["raises", "prints"])
def test_an_oom_under_the_popcorn_protocol_beside_a_small_holder_stays_the_submissions(tmp_path, small_holder,
                                                                                       submission):
    """Under popcorn the submission shares eval.py's process: its stderr is its own to write, never evidence."""
    result, _ = run_harness(job_for(popcorn_workdir(tmp_path, submission), "test", protocol="popcorn"))
    assert result["status"] == "ok" and result["verdict"] in ("crash", "fail")
    assert device.DEVICE_BUSY_FLAG not in result["flags"]


@pytest.mark.slow
@pytest.mark.parametrize(("submission", "held", "status", "verdict"), [
    ("wrong", 70000, "ok", "fail"), (KERNEL_OOM, 70000, "error", "fail"), (KERNEL_OOM, 1, "ok", "crash")],
    ids=["wrong-answer-big-holder", "crash-big-holder", "crash-small-holder"])
def test_under_the_popcorn_protocol_only_a_crash_can_be_the_devices_fault(tmp_path, smi, submission, held, status,
                                                                          verdict):
    """A wrong answer eval.py reports (`check: fail`) stays the competitor's whoever holds the device; a stage that
    crashed (no result, nonzero exit: how a torch out-of-memory error ends the process) is the device's only when
    measured memory says others held enough."""
    smi(others=[(os.getpid(), held)])
    code = (SUBMISSIONS / "wrong.py").read_text() if submission == "wrong" else submission
    result, _ = run_harness(job_for(popcorn_workdir(tmp_path, code), "test", protocol="popcorn"))
    assert (result["status"], result["verdict"]) == (status, verdict), result["error"]
    assert (device.DEVICE_BUSY_FLAG in result["flags"]) == (status == "error")


def test_the_reference_childs_memory_counts_as_the_parents():
    """The reference's own child (kernelbot.ReferenceSession) is the run's trusted side: what it holds is never the
    submission's."""
    gib = 1 << 30
    memory = device.Memory("nvidia-smi", 80 * gib, 100, own=[device.Holder(100, "root", gib, "0"),
                                                            device.Holder(200, "nobody", 2 * gib, "0"),
                                                            device.Holder(300, "root", 4 * gib, "0")], others=[])
    assert memory.held(child=True) == 6 * gib
    seen = device.as_parents(memory, 300)
    assert (seen.held(child=False), seen.held(child=True), seen.held()) == (5 * gib, 2 * gib, 7 * gib)


def test_apportioning_ends_the_reference_child_first(monkeypatch):
    """Where the driver does not say who holds what, the reference's child is ended first (its share the parent's),
    then the submission's (its share the child's); what is left, less the parent's own, is other processes'."""
    gib = 1 << 30
    session = kernelbot.ChildSession.__new__(kernelbot.ChildSession)
    ended, memory = [], device.device_wide(free=10 * gib, total=80 * gib)
    session.measure, session.used = lambda: memory, lambda m: 70 * gib
    session.reference = SimpleNamespace(ended=lambda m: ended.append("reference") or 66 * gib)
    session.ended = lambda m: ended.append("child") or 60 * gib
    monkeypatch.setattr(kernelbot.ChildSession, "parent_use", staticmethod(lambda: gib))
    got = session.memory_at_oom()
    assert ended == ["reference", "child"]
    assert (got.held(child=True), got.held(child=False), got.foreign()) == (6 * gib, 5 * gib, 59 * gib)
