"""One serialiser for a run, applying the secret-run rule and the log-privacy rule once (`access.authority`):
/api/v1, popcorn's wire shapes, the SSE streams, the websockets and the site's submission page all render from
`run_out`; the Discord bot will too."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from runners.harness.result import PROBLEM_BROKEN

from .access.authority import RunView, may_see_run_details
from .models import TERMINAL_STATUSES, BoardEntry, Run, RunStatus, Submission, SubmissionMode
from .ranking import Interval, slower_run

SCORE_RULES = {SubmissionMode.LEADERBOARD: "the time of its public or secret run, whichever ranks lower (the larger "
                                           "ratio to the reference; the longer time when a run has none)"}
PUBLIC_RUN_SCORE = "its public run's time"


class Outcome:
    """What a terminal run came to, in classes that name no input: all a secret run shows to non-staff."""

    PASSED = "passed"
    WRONG_OUTPUT = "wrong_output"
    TIMED_OUT = "timed_out"
    CRASHED = "crashed"
    LIMIT_EXCEEDED = "limit_exceeded"
    REJECTED = "rejected"  # the harness refused the results (status hacked)
    NOT_EVALUATED = "not_evaluated"  # given up after infrastructure failures
    CANCELLED = "cancelled"  # an organiser (or the platform: a failed pool check, a deleted submission) stopped it
    PROBLEM_BROKEN = "problem_broken"  # the problem's own code failed (`Run.problem_error`): not the competitor's

    TEXT = {PASSED: "passed", WRONG_OUTPUT: "wrong output", TIMED_OUT: "timed out", CRASHED: "crashed",
            LIMIT_EXCEEDED: "limit exceeded", REJECTED: "rejected by the harness", NOT_EVALUATED: "not evaluated",
            CANCELLED: "cancelled by an organiser", PROBLEM_BROKEN: PROBLEM_BROKEN}


# how a sandbox kill is reported in the first line of a crash (runners/harness/sandbox.py _SIGNAL_REASONS)
LIMIT_MARKERS = ("limit exceeded", "SIGKILL", "SIGXCPU", "SIGXFSZ", "out of memory")


def outcome(run: Run) -> str | None:
    if run.status not in TERMINAL_STATUSES:
        return None
    verdict = run.verdict
    if run.status == RunStatus.SUCCEEDED and run.passed:
        return Outcome.PASSED
    if run.status == RunStatus.ERROR and run.problem_error:
        return Outcome.PROBLEM_BROKEN
    if run.status == RunStatus.CANCELLED:
        return Outcome.CANCELLED
    if run.status == RunStatus.ERROR:
        return Outcome.NOT_EVALUATED
    if run.status == RunStatus.HACKED:
        return Outcome.REJECTED
    if run.status == RunStatus.TIMED_OUT or verdict == "timeout":
        return Outcome.TIMED_OUT
    if verdict in ("limit", "limit_exceeded") or (
            verdict == "crash" and any(m in run.error.partition("\n")[0] for m in LIMIT_MARKERS)):
        return Outcome.LIMIT_EXCEEDED
    if verdict in ("crash", "compile_error"):
        return Outcome.CRASHED
    return Outcome.WRONG_OUTPUT


def case_out(case: dict[str, Any], details: bool) -> dict[str, Any]:
    """One test or benchmark case as the harness reported it; the checker's message only with the details."""
    return case if details else {k: v for k, v in case.items() if k != "message"}


def iso(value) -> str | None:
    return value.isoformat() if value else None


def problem_error_of(result: dict[str, Any]) -> dict[str, Any]:
    """The harness's `{"where", "traceback"}` of a problem error (its `Result.extra`, which travels at the top level
    of the result); {} for any other result."""
    found = (result or {}).get("problem_error")
    return found if isinstance(found, dict) else {}


def problem_error_detail(run: Run) -> dict[str, Any] | None:
    """Where and how the problem's own code failed, with its traceback (None for other runs): staff only
    (`RunView.ALL`, the admin), since a problem's code and its inputs are the organisers'. Everyone else reads the
    plain PROBLEM_BROKEN."""
    if not run.problem_error:
        return None
    detail = problem_error_of(run.result)
    return {"error": str((run.result or {}).get("error") or run.error), "where": str(detail.get("where") or ""),
            "traceback": str(detail.get("traceback") or "")}


# The run's seconds by phase, in order: (name, the harness's `seconds` entries it sums). queue and dispatch come from
# the run's own timestamps; the rest from its result (kernelbot-protocol runs: runners/harness/kernelbot.py).
PHASES = (("harness_start", ("parent_start", "child_start", "child_ready")), ("device_context", ("device_context",)),
          ("problem", ("problem_load", "calibrate")), ("import", ("submission_import",)), ("profile", ("profile",)),
          ("tests", ("tests",)), ("reference", ("reference_start",)), ("benchmarks", ("benchmark",)),
          ("ranked", ("ranked",)), ("teardown", ("teardown",)))
PHASE_NAMES = {"queue": "queued", "dispatch": "dispatch", "harness_start": "harness start",
               "device_context": "device context", "problem": "problem setup", "import": "import",
               "profile": "profile", "tests": "tests", "reference": "reference start", "benchmarks": "benchmarks",
               "ranked": "ranked", "teardown": "teardown"}


def phase_seconds(run: Run, result: dict[str, Any]) -> dict[str, float]:
    """Where the run's time went: queue (queued until a device was chosen: `dispatched_at`), dispatch (from then until
    the agent has the job: `started_at`), then the harness's phases from `result` (empty when the viewer may not see
    timings)."""
    spans = {"queue": (run.queued_at, run.dispatched_at), "dispatch": (run.dispatched_at, run.started_at)}
    out = {name: round((end - start).total_seconds(), 3) for name, (start, end) in spans.items()
           if start is not None and end is not None and end >= start}
    measured = result.get("seconds")
    if isinstance(measured, dict):
        for name, parts in PHASES:
            found = [float(measured[p]) for p in parts if isinstance(measured.get(p), int | float)]
            if found:
                out[name] = round(sum(found), 3)
    return out


def phase_line(seconds: dict[str, float]) -> str:
    """One line a competitor reads: "queued 2.1 s · dispatch 0.4 s · harness start 1.2 s · …"."""
    return " · ".join(f"{PHASE_NAMES.get(name, name)} {value:.1f} s" if value >= 0.1 else
                      f"{PHASE_NAMES.get(name, name)} {value * 1000:.0f} ms" for name, value in seconds.items())


def run_out(run: Run, view: RunView) -> dict[str, Any]:
    """Everything a viewer with `view` may know of a run. Needs `run.gpu_type`. A run the problem's own code broke
    shows every viewer but staff the plain PROBLEM_BROKEN and nothing of what the harness sent back."""
    details = may_see_run_details(view, run)
    timings = details or not run.secret  # a public run's score, progress and timings go with its outcome
    problem_error = problem_error_detail(run) if view is RunView.ALL else None
    # an unfinished run has no error: what `error` holds then is why the last attempt ended ("requeued by an
    # organiser", an infrastructure retry), which its attempts keep for staff
    error = run.error if details and run.status in TERMINAL_STATUSES else ""
    if run.problem_error:
        error = problem_error["error"] if problem_error else PROBLEM_BROKEN
        details = timings = details and problem_error is not None
    result = (run.result or {}) if timings else {}
    cases = {phase: [case_out(c, details) for c in result.get(phase) or []]
             for phase in ("tests", "benchmarks", "ranked")}
    return {"id": run.pk, "gpu": run.gpu_type.name, "secret": run.secret, "status": run.status,
            "attempt": run.attempt, "outcome": outcome(run), "passed": run.passed,
            "score": run.score if timings else None, "progress": run.progress if timings else {},
            **{name: getattr(run, name) if timings else None for name in ("ratio", "ratio_low", "ratio_high")},
            "queued_at": run.queued_at, "dispatched_at": run.dispatched_at, "started_at": run.started_at,
            "finished_at": run.finished_at, "seconds": phase_seconds(run, result), **cases,
            "system_info": run.system_info if timings else {},
            "error": error, "stdout": run.stdout if details else "",
            "stderr": run.stderr if details else "", "profile": result.get("profile") if details else None,
            "problem_error": problem_error}


def submission_results(mode: str, runs: Iterable[Run]) -> dict[str, tuple[float, Interval | None]]:
    """GPU type name → a submission's one (score, ratio) there, the board entry's (`actions.ranked_candidates`):
    for a ranked submission the slower of its public and secret runs once both passed, for other modes (which have
    no secret run) its public run's. Every front-end shows this one. Needs `run.gpu_type`."""
    found: dict[str, dict[bool, tuple[float, Interval | None]]] = {}
    for run in runs:
        if run.passed and run.score is not None:
            high = math.inf if run.ratio_high is None else run.ratio_high
            ratio = None if run.ratio is None else Interval(run.ratio, run.ratio_low or 0.0, high)
            found.setdefault(run.gpu_type.name, {})[run.secret] = (run.score, ratio)
    needed = 2 if mode == SubmissionMode.LEADERBOARD else 1
    return {gpu: slower_run(list(scores.values())) for gpu, scores in found.items() if len(scores) == needed}


def submission_scores(mode: str, runs: Iterable[Run]) -> dict[str, float]:
    """`submission_results` without the ratios."""
    return {gpu: score for gpu, (score, _) in submission_results(mode, runs).items()}


def submission_standing(submission: Submission, runs: Iterable[Run]) -> dict[str, dict[str, Any]]:
    """GPU type name → what ranks the submission there, as its board row shows it: its score, the ranked ratio with
    its 95 % interval, and, while it is its user's entry on the board, its rank and whether it is statistically
    tied with the entry above (rank None: not on the board). Every front-end shows this one."""
    results = submission_results(submission.mode, runs)
    entries = {e.gpu_type.name: e for e in BoardEntry.objects.filter(submission=submission).select_related("gpu_type")
               .with_rank()} if results and submission.mode == SubmissionMode.LEADERBOARD else {}
    out = {}
    for gpu, (score, ratio) in results.items():
        entry = entries.get(gpu)
        out[gpu] = {"score": score, "ratio": ratio and ratio.value, "ratio_low": ratio and ratio.low,
                    "ratio_high": None if ratio is None or math.isinf(ratio.high) else ratio.high,
                    "rank": entry and entry.rank, "tied": bool(entry and entry.tied)}
    return out


def score_rule(mode: str) -> str:
    return SCORE_RULES.get(mode, PUBLIC_RUN_SCORE)


def failure_text(shown: dict[str, Any]) -> str:
    """A failed run's error as this viewer may read it: the error itself, or else its outcome class (a broken
    problem's plain message is everyone's)."""
    if shown["error"] or shown["outcome"] == Outcome.PROBLEM_BROKEN:
        return shown["error"]
    kind = "secret run" if shown["secret"] else "run"
    return f"{kind} on {shown['gpu']}: {Outcome.TEXT.get(shown['outcome'], shown['status'])}" + \
        (" (details are for staff)" if shown["secret"] else "")


LIVE_FIELDS = ("status", "attempt", "secret", "gpu", "progress", "passed", "score", "outcome")


def live_run(run: Run) -> dict[str, Any]:
    """The small JSON state the submission websocket sends (snapshot and deltas alike): outcome-level only, so
    one event serves every viewer of the submission."""
    shown = run_out(run, RunView.OUTCOME)
    return {"run": run.pk, **{k: shown[k] for k in LIVE_FIELDS},
            **{k: iso(shown[k]) for k in ("queued_at", "dispatched_at", "started_at", "finished_at")}}


FAILED_JOB = (RunStatus.FAILED, RunStatus.TIMED_OUT, RunStatus.HACKED, RunStatus.ERROR, RunStatus.CANCELLED)


def job_state(runs: list[Run], view: RunView) -> tuple[bool, str, str]:
    """(done, job status, error as `view` may read it) from one snapshot of the runs, so `done` and the final
    status always agree."""
    done = bool(runs) and all(r.status in TERMINAL_STATUSES for r in runs)
    failed = next((r for r in runs if r.status in FAILED_JOB), None)
    if failed is not None and done:
        return True, failed.status, failure_text(run_out(failed, view))
    if done:
        return True, "succeeded", ""
    if any(r.status == RunStatus.RUNNING for r in runs):
        return False, "running", ""
    return False, "pending", ""
