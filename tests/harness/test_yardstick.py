"""One yardstick for both sides, and work outside the timed stream, through a fake CUDA layer (no GPU here): a device
with a clock per stream, events that mark a stream's timeline, a synchronize that waits for every stream."""

from __future__ import annotations

import math
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from runners.harness import child, kernelbot, stats
from runners.harness.job import Job

LAUNCH_MS, ROUND_TRIP_MS, FLUSH_MS = 0.004, 0.012, 0.08


class FakeDevice:
    """Times in ms. Host calls advance the host clock; work queued on a stream starts when both the stream is free
    and the host has launched it. `count` devices share the host: a stream named "gpu<i>:..." is on device i, any
    other on device 0 (the current one)."""

    def __init__(self, count: int = 1):
        self.host = 0.0
        self.streams = {"current": 0.0}
        self.current = "current"
        self.count = count

    def launch(self, ms: float, stream: str | None = None) -> None:
        stream = stream or self.current
        self.host += LAUNCH_MS
        self.streams[stream] = max(self.streams.get(stream, 0.0), self.host) + ms

    def join(self, other: str) -> None:
        """The current stream waits for `other` (an event recorded there, waited on here)."""
        self.streams[self.current] = max(self.streams[self.current], self.streams[other])

    def synchronize(self, device: int | None = None) -> None:
        """torch.cuda.synchronize(device): the streams of that device (the current one, 0, when None) only."""
        index = device or 0
        on = [t for name, t in self.streams.items() if (int(name[3:].split(":")[0]) if name.startswith("gpu") else 0)
              == index]
        self.host = max([self.host, *on]) + ROUND_TRIP_MS


def fake_torch(device: FakeDevice) -> SimpleNamespace:
    class Event:
        def __init__(self, enable_timing: bool = False):
            self.at = None

        def record(self) -> None:
            device.host += LAUNCH_MS
            self.at = device.streams[device.current] = max(device.streams[device.current], device.host)

        def synchronize(self) -> None:
            device.host = max(device.host, self.at)

        def elapsed_time(self, end: Event) -> float:
            return end.at - self.at

    flush = SimpleNamespace(zero_=lambda: device.launch(FLUSH_MS))
    cuda = SimpleNamespace(Event=Event, synchronize=device.synchronize, is_available=lambda: True,
                           device_count=lambda: device.count)
    return SimpleNamespace(cuda=cuda, int8="int8", empty=lambda *a, **k: flush)


def one_stream(device, ms):
    return lambda data: device.launch(ms)


def side_stream(device, ms):
    """Returns as soon as its work is queued on a stream of its own: the end mark does not wait for it."""
    return lambda data: device.launch(ms, stream="side")


def joined_streams(device, ms):
    """Honest multi-stream: half the work on a side stream, joined to the current one before returning."""
    def kernel(data):
        device.launch(ms / 2, stream="side")
        device.launch(ms / 2)
        device.join("side")
    return kernel


def allowance(yardstick: child.Yardstick) -> tuple[float, float]:
    """The baseline and the allowance the parent calibrates (KernelbotRun.calibrate_late) on the same device."""
    run = SimpleNamespace(yardstick=yardstick, late_baseline=0.0, late_allowance=math.inf)
    kernelbot.KernelbotRun.calibrate_late(run)
    return run.late_baseline, run.late_allowance


def batch(kernel_for, ms: float, calls: int = 8) -> tuple[list[int], list[int], tuple[float, float]]:
    device = FakeDevice()
    yardstick = child.Yardstick(fake_torch(device))
    allowed = allowance(yardstick)
    kernel = kernel_for(device, ms)
    timed = [yardstick(kernel, None) for _ in range(calls)]
    return [ns for _, ns, _ in timed], [late for _, _, late in timed], allowed


@pytest.mark.parametrize(("kernel_for", "work_ms"), [(one_stream, 0.5), (joined_streams, 0.25)])
def test_work_joined_to_the_timed_stream_is_timed_and_passes(kernel_for, work_ms):
    samples, lates, allowed = batch(kernel_for, ms=0.5)
    assert all(abs(ns / 1e6 - work_ms) < 0.02 for ns in samples), samples  # the work, not the flush or launch
    assert all(late <= allowed[1] for late in lates)
    charged, problem = stats.outside_stream(samples, lates, *allowed)
    assert problem is None and charged == samples


def test_work_left_on_a_side_stream_is_refused_and_charged():
    samples, lates, allowed = batch(side_stream, ms=0.5)
    assert all(ns / 1e6 < 0.05 for ns in samples)  # what the end mark alone would rank: the launch
    charged, problem = stats.outside_stream(samples, lates, *allowed)
    assert problem and problem.startswith("work outside the timed stream")
    assert all(c / 1e6 > 0.4 for c in charged)  # the hidden work, but what overlapped the flush, is in its time


def test_a_side_stream_call_among_honest_ones_is_charged_its_work():
    device = FakeDevice()
    yardstick = child.Yardstick(fake_torch(device))
    allowed = allowance(yardstick)
    calls = [one_stream(device, 0.5)] * 3 + [side_stream(device, 0.5)]  # cheats on one call in four
    timed = [yardstick(kernel, None) for kernel in calls]
    charged, problem = stats.outside_stream([t[1] for t in timed], [t[2] for t in timed], *allowed)
    assert problem is None  # not every call: no verdict from one batch ...
    assert min(charged) / 1e6 > 0.4  # ... but even its fastest call is charged its work (past the flush)


def other_device(device, ms):
    """Returns as soon as its work is queued on a second device: a synchronize of the current device does not wait."""
    return lambda data: device.launch(ms, stream="gpu1:0")


def joined_devices(device, ms):
    """Honest multi-device: half the work on the second device, the current stream waiting for it before returning."""
    def kernel(data):
        device.launch(ms / 2, stream="gpu1:0")
        device.launch(ms / 2)
        device.join("gpu1:0")
    return kernel


def test_work_left_on_another_device_is_refused_and_charged():
    """The end sync covers every device the process can see (the run's devices), not the current one only."""
    device = FakeDevice(count=2)
    yardstick = child.Yardstick(fake_torch(device))
    allowed = allowance(yardstick)
    timed = [yardstick(other_device(device, 0.5), None) for _ in range(8)]
    samples, lates = [t[1] for t in timed], [t[2] for t in timed]
    assert all(ns / 1e6 < 0.05 for ns in samples)  # the end mark alone: the launch
    assert all(late / 1e6 > 0.4 for late in lates)  # the device idle mark waits for the second device's work
    charged, problem = stats.outside_stream(samples, lates, *allowed)
    assert problem and problem.startswith("work outside the timed stream")
    assert all(c / 1e6 > 0.4 for c in charged)


def test_work_joined_from_another_device_passes():
    device = FakeDevice(count=2)
    yardstick = child.Yardstick(fake_torch(device))
    allowed = allowance(yardstick)
    timed = [yardstick(joined_devices(device, 0.5), None) for _ in range(8)]
    assert all(abs(t[1] / 1e6 - 0.25) < 0.02 for t in timed)
    assert stats.outside_stream([t[1] for t in timed], [t[2] for t in timed], *allowed)[1] is None


def test_cpu_yardstick_has_no_late_work():
    calls = []
    out, ns, late = child.Yardstick(SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: False)))(
        lambda data: calls.append(data) or "out", 7)
    assert (out, late, calls) == ("out", 0, [7]) and ns >= 0
    assert stats.outside_stream([ns], [late], 0.0, math.inf) == ([ns], None)


def reference_run(torch, reference, generate, check, timed_call=None):
    """A KernelbotRun whose reference child is stood in for: its timed calls run `reference` on a Yardstick."""
    import contextlib

    run = kernelbot.KernelbotRun.__new__(kernelbot.KernelbotRun)
    run.problem = SimpleNamespace(generate=generate, reference=reference, check=check)
    run.session = SimpleNamespace(tree=SimpleNamespace(frozen=contextlib.nullcontext))
    run.reference = SimpleNamespace(failing_as_problem=lambda what: contextlib.nullcontext())
    run.late_baseline, calls = 0.0, []

    def default(data, session=None):
        calls.append(session)
        out, ns, late = child.Yardstick(torch)(reference, data)
        return ns, ns, out, late

    run.timed_call = timed_call or default
    return run, calls


def test_the_reference_is_timed_by_its_own_child_as_the_submission_is():
    """Each reference call: fresh inputs generated here, sent to the reference's child through the same timed_call
    as a submission's call (lent, the child's Yardstick, output copied back), then checked here."""
    torch = pytest.importorskip("torch")
    generated, checked = [], []

    def generate(case, seed):
        generated.append(torch.full((4,), float(seed % 1000)))
        return (generated[-1],)

    run, calls = reference_run(torch, lambda data: data[0] * 2, generate,
                               lambda data, out: checked.append(torch.equal(out, data[0] * 2)))
    samples = run.time_reference({"n": 4}, seed=7, calls=3)
    assert len(samples) == 3 and all(isinstance(ns, int) for ns in samples)
    assert calls == [run.reference] * 3  # every call through the reference's session, none in this process
    assert checked == [True, True, True]
    assert len({float(t[0]) for t in generated}) == 3  # fresh inputs per call


def test_the_reference_child_runs_only_the_problems_files(tmp_path, monkeypatch):
    """The reference's child gets a directory of its own: the problem's files and a submission.py that is the
    reference; nothing of the submission's, no links out; the directory goes with the session."""
    pytest.importorskip("torch")
    (tmp_path / "reference.py").write_text("def ref_kernel(data):\n    return data\n")
    (tmp_path / "utils.py").write_text("X = 1\n")
    (tmp_path / "submission.py").write_text("import os\nos.system('touch /tmp/pwned')\n")
    (tmp_path / kernelbot.CHILD_SCRIPT).write_text("# stale\n")
    os.symlink("/etc/passwd", tmp_path / "link.py")
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "tables.py").write_text("T = 2\n")
    made = []
    monkeypatch.setattr(kernelbot.ChildSession, "__init__", lambda self, job, **kw: made.append(
        (job.workdir, kw, sorted(os.listdir(job.workdir)), Path(job.workdir, "submission.py").read_text())))
    monkeypatch.setattr(kernelbot.ChildSession, "close", lambda self, grace_s=5.0: None)
    session = kernelbot.ReferenceSession(Job(mode="benchmark", workdir=str(tmp_path)))
    ((workdir, kwargs, files, code),) = made
    assert workdir != str(tmp_path) and kwargs == {"spare": False, "reference": True}
    assert files == ["helpers", "reference.py", "submission.py", "utils.py"]  # the problem's modules, a package too
    assert Path(workdir, "helpers", "tables.py").read_text() == "T = 2\n"
    assert code == kernelbot.ReferenceSession.KERNEL == "from reference import ref_kernel as custom_kernel\n"
    session.close()
    assert not os.path.exists(os.path.dirname(workdir))


def partly_side_stream(device, ms):
    """Identical code on both sides that leaves part of its work on a side stream (less than the refusal's threshold
    in some calls, say): each call is charged what the device stayed busy after its end mark."""
    def kernel(data):
        device.launch(ms * 0.2)
        device.launch(ms * 0.8, stream="side")
    return kernel


def test_the_reference_is_charged_its_late_work_as_the_submission_is():
    """The same code timed as the submission (the child's samples, charged by stats.outside_stream) and as the
    reference (time_reference, through its child's Yardstick) gives the same figures: the late charge applies to both
    sides."""
    torch = pytest.importorskip("torch")
    device = FakeDevice()
    yardstick = child.Yardstick(fake_torch(device))
    baseline, allowed = allowance(yardstick)
    kernel = partly_side_stream(device, 0.5)
    timed = [yardstick(kernel, None) for _ in range(4)]
    submission, _ = stats.outside_stream([t[1] for t in timed], [t[2] for t in timed], baseline, allowed)

    def timed_call(data, session=None):
        out, ns, late = yardstick(kernel, data)
        return ns, ns, out, late

    run, _ = reference_run(torch, kernel, lambda case, seed: (torch.ones(4),), lambda data, out: (True, ""),
                           timed_call)
    run.late_baseline = baseline
    reference = run.time_reference({"n": 4}, seed=7, calls=4)
    assert min(s - t[1] for s, t in zip(submission, timed, strict=True)) > 100_000  # charged its late work
    assert all(abs(r - s) < 1_000 for r, s in zip(reference, submission, strict=True)), (reference, submission)


@pytest.mark.parametrize("swap", ["sync", "elapsed", "event", "call", "instance", "flush", "clock"])
def test_the_child_reports_a_swapped_yardstick(monkeypatch, swap):
    """The child's tamper check watches the Yardstick's captured references and its class's call as it watches the
    clocks: a submission that reaches into the child's module and swaps one times itself."""
    pytest.importorskip("torch")
    import socket

    ours, theirs = socket.socketpair()
    runner = child.Runner(ours)
    assert runner.tampering() is None
    stick = runner.yardstick
    if swap == "call":
        monkeypatch.setattr(child.Yardstick, "__call__", lambda self, fn, data: (fn(data), 1, 0))
    elif swap == "instance":
        runner.yardstick = child.Yardstick(runner.torch)
    else:
        setattr(stick, swap, lambda *a, **k: None)
    name = {"call": "Yardstick.__call__", "instance": "yardstick"}.get(swap, f"yardstick.{swap}")
    assert runner.tampering() == f"the submission replaced {name}"
    ours.close()
    theirs.close()
