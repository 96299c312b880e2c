"""Host load slows both sides alike: the interleaved timing loop (kernelbot.KernelbotRun.run_timed) driven with a fake
host clock whose speed drifts in steps, as load arriving and leaving would make it, no real load and no real clock.
The submission's batches (its child's Yardstick) and the reference's (its own child's) alternate on the same clock, so
identical work scores 1.00x with an interval covering 1, and an honestly slower side still ranks slower."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest

from runners.harness import child, kernelbot
from runners.harness.job import Timing
from runners.harness.result import Result

WORK_NS = 1_000_000  # one call's work on an idle host
STEP_NS = 40_000_000  # the host's load changes every 40 ms of host time (a batch pair takes 20-60 ms) ...
SLOWDOWNS = (1.0, 2.0, 1.3, 3.0, 1.0, 1.7, 2.5)  # ... to these factors in turn
CALLS = 10  # per batch, each side


class DriftingClock:
    """Host time in ns. A call's work takes its idle duration times the slowdown in force when it starts."""

    def __init__(self):
        self.now = 0

    def __call__(self) -> int:
        return self.now

    def work(self, ns: float) -> None:
        self.now += int(ns * SLOWDOWNS[self.now // STEP_NS % len(SLOWDOWNS)])


def timed_run(torch, clock: DriftingClock, submission_factor: float) -> kernelbot.CaseResult:
    def kernel(factor: float):
        def run(data):
            clock.work(WORK_NS * factor)
            return data[0] * 2
        return run

    reference, submission = kernel(1.0), kernel(submission_factor)
    run = kernelbot.KernelbotRun.__new__(kernelbot.KernelbotRun)
    run.job = SimpleNamespace(seed=7, timeout=lambda phase: 600,
                              timing=Timing(rel_ci=0.001, max_samples=40 * CALLS, case_budget_s=600, warmup_s=0,
                                            run_spread=0.0))
    run.emit, run.result = SimpleNamespace(progress=lambda *a: None), Result(mode="benchmark", protocol="kernelbot")
    run.problem = SimpleNamespace(generate=lambda case, seed: (torch.full((4,), float(seed % 100)),),
                                  reference=reference, check=lambda data, out: (bool((out == data[0] * 2).all()), ""))
    run.session = SimpleNamespace(tree=SimpleNamespace(frozen=contextlib.nullcontext))
    run.reference = SimpleNamespace(failing_as_problem=lambda what: contextlib.nullcontext())
    run.overhead, run.waited, run.thread_ns, run.child_pid = {"n: 4": 1_000}, 0, 0, None
    run.late_baseline, run.late_allowance = 0.0, float("inf")
    sticks = {id(run.session): child.Yardstick(torch, cuda=False, clock=clock),  # each child's own instance
              id(run.reference): child.Yardstick(torch, cuda=False, clock=clock)}

    def timed_call(data, session=None):
        session = session or run.session
        out, ns, late = sticks[id(session)](reference if session is run.reference else submission, data)
        return ns, ns + 1_000, out, late

    run.call, run.timed_call, run.batch_calls = submission, timed_call, lambda call_ns: CALLS
    (result,) = run.run_timed("benchmark", ({"n": 4},))
    assert clock.now > 3 * STEP_NS  # the load changed several times while the case was timed
    return result


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def test_identical_work_under_drifting_load_scores_one(torch):
    result = timed_run(torch, DriftingClock(), 1.0)
    ratio = result.ratio
    assert round(ratio.value, 2) == 1.00 and ratio.low <= 1.0 <= ratio.high, ratio
    batches = [b[0] / b[1] for b in result.batches]
    assert min(batches) < 0.9 or max(batches) > 1.1  # some batches did meet a change of load: the test has teeth


def test_an_honestly_slower_side_still_ranks_slower_under_drifting_load(torch):
    ratio = timed_run(torch, DriftingClock(), 1.5).ratio
    assert round(ratio.value, 2) == 1.50 and ratio.low > 1.0, ratio


def test_the_reference_alone_timed_on_a_different_clock_would_not_score_one(torch):
    """What the interleaving buys: the same work timed before the load arrived and after does not score 1."""
    clock = DriftingClock()
    stick = child.Yardstick(torch, cuda=False, clock=clock)
    before = min(stick(lambda _: clock.work(WORK_NS), None)[1] for _ in range(CALLS))
    clock.now = STEP_NS  # load arrives
    after = min(stick(lambda _: clock.work(WORK_NS), None)[1] for _ in range(CALLS))
    assert after / before == pytest.approx(2.0)
