from datetime import UTC, datetime, timedelta

import pytest

from leaderboards.ranking import Candidate, rank, score_seconds

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
