"""Scores, ratios and final progress from a harness result (used when a result is ingested and on rescoring)."""

from __future__ import annotations

from taskspec.scoring import score_seconds

from .models import Problem, Run, SubmissionMode
from .ranking import Interval, ratio_fields, ratio_from_timings  # noqa: F401 - ratio_fields re-exported

MODE_PHASES = {SubmissionMode.TEST: ("test",), SubmissionMode.BENCHMARK: ("benchmark",),
               SubmissionMode.LEADERBOARD: ("test", "benchmark", "ranked"), SubmissionMode.PROFILE: ()}
PHASE_RESULTS = {"test": "tests", "benchmark": "benchmarks", "ranked": "ranked"}


def phase_totals(run: Run) -> dict[str, int]:
    tests, benchmarks = (Problem.objects.filter(pk=run.submission.problem_id)
                         .values_list("definition__tests", "definition__benchmarks").get())
    tests, benchmarks = len(tests or []), len(benchmarks or [])
    last_only = run.submission.leaderboard.ranking_by == "last"
    return {"test": tests, "benchmark": benchmarks, "ranked": min(1, benchmarks) if last_only else benchmarks}


def final_progress(result: dict, mode: str, totals: dict[str, int]) -> dict:
    """Where the finished run got to: the first phase of its mode whose cases did not all pass (or the last
    phase), with the cases that passed. Replaces the last live progress, which can be ahead of a crash. Both
    protocols run a leaderboard submission as tests, benchmarks, then the ranked cases."""
    progress: dict = {}
    for phase in MODE_PHASES.get(mode, ()):
        cases = result.get(PHASE_RESULTS[phase]) or []
        passed = sum(1 for case in cases if isinstance(case, dict) and case.get("status") == "pass")
        progress = {"phase": phase, "done": passed, "total": totals[phase], "final": True}
        if passed < totals[phase]:
            break
    return progress


def _timings(result: dict, mode: str) -> list[dict]:
    return (result.get("ranked") if mode == SubmissionMode.LEADERBOARD else result.get("benchmarks")) or []


def score_from_result(result: dict, mode: str, ranking_by: str) -> float:
    """Seconds: the harness's robust per-case `time` (median over interleaved batches), else the mean."""
    means = [float(t["time"] if t.get("time") is not None else t["mean"]) for t in _timings(result, mode)]
    return score_seconds(means, ranking_by)


def ratio_from_result(result: dict, mode: str, ranking_by: str) -> Interval | None:
    return ratio_from_timings(_timings(result, mode), ranking_by)
