"""A case whose wall time its samples do not explain is timed again before it is a verdict: a burst of load on the host
leaves wall time unexplained once, work a submission hides leaves it every time (kernelbot.plausibly_timed)."""

from runners.harness.kernelbot import PLAUSIBILITY_TRIES, Timing, plausibly_timed

HONEST = Timing(samples=[1e6] * 20, walls=[1.1e6] * 20, batches=[], reason="ci", waited=0)
# 20 calls of 1 ms reported in 10 ms of wall time each, none of it waiting for a CPU: 180 ms nobody explains
HIDING = Timing(samples=[1e6] * 20, walls=[10e6] * 20, batches=[], reason="ci", waited=0)


def timings(*sequence: Timing):
    given = iter(sequence)
    calls = []

    def time_case() -> Timing:
        calls.append(1)
        return next(given)
    return time_case, calls


def test_a_plausible_timing_is_taken_at_once():
    time_case, calls = timings(HONEST)
    assert plausibly_timed(time_case, overhead=50_000) == (HONEST, []) and len(calls) == 1


def test_one_unexplained_timing_is_timed_again_and_the_plausible_one_counts():
    time_case, calls = timings(HIDING, HONEST)
    timed, flagged = plausibly_timed(time_case, overhead=50_000)
    assert timed is HONEST and len(calls) == 2
    assert len(flagged) == 1 and "work was done outside the timed interval" in flagged[0]


def test_hiding_work_in_every_timing_is_a_verdict():
    time_case, calls = timings(*[HIDING] * PLAUSIBILITY_TRIES)
    timed, flagged = plausibly_timed(time_case, overhead=50_000)
    assert timed is None and len(flagged) == len(calls) == PLAUSIBILITY_TRIES


def test_waiting_for_a_cpu_explains_wall_time():
    loaded = Timing(samples=[1e6] * 20, walls=[10e6] * 20, batches=[], reason="ci", waited=180e6)
    time_case, _ = timings(loaded)
    assert plausibly_timed(time_case, overhead=50_000) == (loaded, [])
