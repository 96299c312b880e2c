import pytest

from .helpers import SUBMISSIONS, run_submission

pytestmark = pytest.mark.slow


def test_leaderboard_fast_ranks_faster_than_slow(tmp_path):
    fast = run_submission(tmp_path / "fast", SUBMISSIONS / "fast.py", "leaderboard")
    slow = run_submission(tmp_path / "slow", SUBMISSIONS / "slow.py", "leaderboard")
    for r in (fast, slow):
        assert (r["status"], r["verdict"], r["passed"]) == ("ok", "pass", True), r["error"]
        assert [t["status"] for t in r["tests"]] == ["pass"] * 3
        assert len(r["benchmarks"]) == 2 and len(r["ranked"]) == 1  # ranking_by=last
        ranked = r["ranked"][0]
        assert ranked["stop_reason"] in ("ci", "budget", "max_samples")
        assert ranked["ci_low"] <= ranked["mean"] <= ranked["ci_high"] and ranked["runs"] >= 10
    assert fast["ranked"][0]["ratio_high"] < slow["ranked"][0]["ratio_low"]  # what ranks: the ratio
    assert fast["score"] < slow["score"] and fast["score_ratio"]["value"] < slow["score_ratio"]["value"]
