import math
from datetime import UTC, datetime, timedelta

import pytest

from leaderboards.ranking import Candidate, Interval, rank, ratio_from_timings, slower_run, statistically_tied
from taskspec.scoring import score_seconds

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(("means", "rule", "expected"), [
    ([1000.0], "last", 1e-6),
    ([1000.0, 3000.0], "last", 3e-6),
    ([1000.0, 3000.0], "mean", 2e-6),
    ([1000.0, 4000.0], "geom", 2e-6),
    ([500.0, 500.0, 500.0], "geom", 5e-7),
])
def test_score_rules(means, rule, expected):
    assert score_seconds(means, rule) == pytest.approx(expected)


@pytest.mark.parametrize(("means", "rule"), [([], "mean"), ([0.0], "last"), ([float("nan")], "geom"),
                                              ([-1.0], "mean"), ([1.0], "median")])
def test_score_rejects_unusable_input(means, rule):
    with pytest.raises(ValueError):
        score_seconds(means, rule)


def c(user, sub, score, minutes=0):
    return Candidate(user, sub, score, T0 + timedelta(minutes=minutes))


@pytest.mark.parametrize(("candidates", "expected"), [
    # (user, submission, score, minutes) -> [(user, submission, rank)]
    ([c(1, 10, 2.0), c(2, 20, 1.0)], [(2, 20, 1), (1, 10, 2)]),
    ([c(1, 10, 2.0), c(1, 11, 1.5), c(2, 20, 1.8)], [(1, 11, 1), (2, 20, 2)]),  # best per user
    ([c(1, 10, 1.0, 5), c(2, 20, 1.0, 1), c(3, 30, 2.0)], [(2, 20, 1), (1, 10, 1), (3, 30, 3)]),  # ties share
    ([c(1, 10, 1.0, 5), c(1, 11, 1.0, 1)], [(1, 11, 1)]),  # earliest equal submission keeps the entry
    ([], []),
])
def test_rank_table(candidates, expected):
    assert [(r.user_id, r.submission_id, r.rank) for r in rank(candidates)] == expected


Iv = Interval


@pytest.mark.parametrize(("a", "b", "tied"), [
    (Iv(1.0, 0.95, 1.05), Iv(1.2, 1.14, 1.26), False),  # clearly apart
    (Iv(1.0, 0.9, 1.1), Iv(1.05, 0.95, 1.15), True),  # overlapping intervals
    (Iv(1.0, 0.98, 1.02), Iv(1.0, 0.98, 1.02), True),  # identical
    (Iv(1.0, 0.9, 1.1), Iv(1.13, 1.08, 1.18), False),  # the intervals overlap, yet the difference is significant
    (Iv(1.0, 0.9, 1.1), Iv(1.16, 1.0, 1.3), True),  # a wide interval on either side keeps them tied
    (Iv(1.0, 0.0, 1.05), Iv(3.0, 2.9, 3.1), False),  # the fast one's missing lower bound does not matter ...
    (Iv(1.0, 0.95, math.inf), Iv(3.0, 2.9, 3.1), True),  # ... its missing upper bound does
])
def test_statistically_tied(a, b, tied):
    assert statistically_tied(a, b) is tied
    assert statistically_tied(b, a) is tied  # symmetric


def r(user, sub, ratio, low, high, minutes=0):
    return Candidate(user, sub, ratio * 1e-3, T0 + timedelta(minutes=minutes), Interval(ratio, low, high))


@pytest.mark.parametrize(("candidates", "expected"), [
    # -> [(user, rank, tied)]
    ([r(1, 10, 1.0, 0.95, 1.05), r(2, 20, 2.0, 1.9, 2.1)], [(1, 1, False), (2, 2, False)]),
    ([r(1, 10, 1.0, 0.9, 1.1), r(2, 20, 1.05, 0.95, 1.15), r(3, 30, 2.0, 1.9, 2.1)],
     [(1, 1, False), (2, 2, True), (3, 3, False)]),  # tied entries keep their order and ranks
    ([r(1, 10, 1.0, 0.9, 1.1, 5), r(2, 20, 1.0, 0.9, 1.1, 1)], [(2, 1, False), (1, 1, True)]),  # equal: shared
    ([r(1, 10, 1.0, 0.9, 1.1), r(2, 20, 1.05, 0.95, 1.15), r(3, 30, 1.1, 1.0, 1.2)],
     [(1, 1, False), (2, 2, True), (3, 3, True)]),  # a chain: each tied with the one above
])
def test_rank_marks_statistical_ties(candidates, expected):
    assert [(x.user_id, x.rank, x.tied) for x in rank(candidates)] == expected


def test_ratio_ranks_when_every_entry_has_one_else_time():
    slow_host = Candidate(1, 10, 5e-3, T0, Interval(0.5, 0.45, 0.55))  # a slow run of the faster kernel
    fast_host = Candidate(2, 20, 2e-3, T0, Interval(0.9, 0.85, 0.95))
    assert [x.user_id for x in rank([slow_host, fast_host])] == [1, 2]
    old = Candidate(3, 30, 3e-3, T0)  # no ratio (older result): the whole board falls back to time
    assert [x.user_id for x in rank([slow_host, fast_host, old])] == [2, 3, 1]
    assert not any(x.tied for x in rank([slow_host, fast_host, old]))


def case(ratio, low, high, reference=1.0):
    return {"mean": 1.0, "ratio": ratio, "ratio_low": low, "ratio_high": high, "reference": reference}


@pytest.mark.parametrize(("timings", "rule", "expected"), [
    ([case(1, 0.9, 1.1), case(4, 3, 5)], "last", (4, 3, 5)),
    ([case(1, 0.5, 2), case(4, 2, 8)], "geom", (2, 1, 4)),
    ([case(1, 0.5, 2, 3.0), case(4, 2, 8, 1.0)], "mean", (1.75, 0.875, 3.5)),  # weighed by reference time
    ([case(1, 0.9, None)], "last", (1, 0.9, math.inf)),  # a null bound (JSON has no inf) means unbounded
    ([{"mean": 1.0}], "last", None),  # results without ratios
    ([case(0.0, 0.0, 1.0)], "last", None),
    ([], "geom", None),
])
def test_ratio_from_timings(timings, rule, expected):
    got = ratio_from_timings(timings, rule)
    assert got == expected if expected is None else (got.value, got.low, got.high) == pytest.approx(expected)


@pytest.mark.parametrize("runs", [
    [(1.0e-6, Interval(0.52, 0.51, 0.53)), (1.2e-6, Interval(0.52, 0.51, 0.53))],  # equal ratios, times differ
    [(1.0e-6, Interval(0.52, 0.50, 0.53)), (1.0e-6, Interval(0.52, 0.51, 0.54))],  # equal ratio and time
    [(1.0e-6, None), (1.0e-6, Interval(0.52, 0.51, 0.53))],  # equal times, by time
])
def test_the_slower_run_does_not_depend_on_the_order_the_runs_are_read_in(runs):
    """The database returns a submission's runs in any order (the incremental ranks and a rebuild read them through
    different plans); on a tie the first read won, so a board could differ from its rebuild (issue 35's fault round:
    a row updated after its result moved in the heap and the entry took the other run's time)."""
    assert slower_run(runs) == slower_run(runs[::-1])
