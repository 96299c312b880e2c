import math

import pytest

from runners.harness import stats


@pytest.mark.parametrize(("df", "expected"), [(1, 12.706), (10, 2.228), (30, 2.042), (60, 2.000), (1000, 1.962)])
def test_t975(df, expected):
    assert stats.t975(df) == pytest.approx(expected, abs=2e-3)


@pytest.mark.parametrize(
    ("samples", "mean", "std", "best", "worst"),
    [([5.0], 5.0, 0.0, 5.0, 5.0), ([1.0, 2.0, 3.0], 2.0, 1.0, 1.0, 3.0), ([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0],
     5.0, math.sqrt(32 / 7), 2.0, 9.0)],
)
def test_summarize(samples, mean, std, best, worst):
    s = stats.summarize(samples)
    assert (s.runs, s.best, s.worst) == (len(samples), best, worst)
    assert s.mean == pytest.approx(mean) and s.std == pytest.approx(std)
    assert s.err == pytest.approx(std / math.sqrt(len(samples)))
    if len(samples) > 1:
        assert s.half_width == pytest.approx(stats.t975(len(samples) - 1) * s.err)
        assert s.ci_low < s.mean < s.ci_high


def test_summarize_empty_is_nan():
    assert math.isnan(stats.summarize([]).mean)


KW = {"rel_ci": 0.01, "min_samples": 10, "max_samples": 100, "budget_s": 5.0}


@pytest.mark.parametrize(
    ("samples", "elapsed", "reason"),
    [
        ([100.0] * 9, 0.1, None),  # below min_samples
        ([100.0] * 10, 0.1, "ci"),  # zero spread
        ([100.0, 200.0] * 5, 0.1, None),  # too noisy
        ([100.0, 200.0] * 5, 6.0, "budget"),
        ([100.0, 200.0] * 50, 0.1, "max_samples"),
        ([100.0], 6.0, None),  # the budget waits for a second sample
        ([100.0, 101.0] * 20, 0.1, "ci"),
    ],
)
def test_stop_reason(samples, elapsed, reason):
    assert stats.stop_reason(samples, elapsed, **KW) == reason


@pytest.mark.parametrize(
    ("means", "ranking_by", "expected"),
    [([1.0, 4.0], "last", 4.0), ([1.0, 4.0], "mean", 2.5), ([1.0, 4.0], "geom", 2.0), ([], "mean", math.nan)],
)
def test_score(means, ranking_by, expected):
    got = stats.score(means, ranking_by)
    assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected)


def test_score_rejects_unknown_ranking():
    with pytest.raises(ValueError):
        stats.score([1.0], "median")


MS = 1_000_000


@pytest.mark.parametrize(
    ("samples", "walls", "overhead", "flagged"),
    [
        ([5 * MS] * 10, [5.5 * MS] * 10, 0.3 * MS, False),  # honest
        ([20_000] * 10, [1.2 * MS] * 10, 0.8 * MS, False),  # tiny kernel: IPC dominates, within slack
        ([1_000] * 10, [10 * MS] * 10, 0.3 * MS, True),  # 10 ms per call hidden from the clock
        ([6 * MS] + [MS] * 9, [5 * MS] * 10, 0.0, True),  # a sample longer than its wall time
        ([-1] * 2, [MS] * 2, 0.0, True),
    ],
)
def test_implausible(samples, walls, overhead, flagged):
    assert (stats.implausible(samples, walls, overhead) is not None) is flagged
