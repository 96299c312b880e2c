"""The JSON shapes popcorn-cli reads, rendered from `serializers.run_out` (so a secret run shows its outcome
class only); shared by the polled and the streamed routes."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from leaderboards import finals
from leaderboards.access.authority import RunView
from leaderboards.models import Leaderboard, Run, RunStatus, Submission, SubmissionMode
from leaderboards.serializers import iso, job_state, run_out

PUBLIC_TASK_KEYS = ("lang", "description", "templates", "tests", "benchmarks", "ranking_by", "test_timeout",
                    "benchmark_timeout", "ranked_timeout", "multi_gpu")


def public_task(leaderboard: Leaderboard) -> dict[str, Any]:
    """Only what a competitor may see: never the secret seed, never file contents."""
    definition = leaderboard.problem.definition
    task = {k: definition[k] for k in PUBLIC_TASK_KEYS if k in definition}
    task["files"] = sorted(definition.get("files", {}))
    return task


def leaderboard_item(leaderboard: Leaderboard) -> dict[str, Any]:
    """KernelBot's LeaderboardItem less its secret seed; no board here has a Discord creator or forum thread."""
    return {"id": leaderboard.pk, "name": leaderboard.name, "description": leaderboard.description,
            "deadline": leaderboard.deadline.isoformat(), "gpu_types": [g.name for g in leaderboard.gpu_types.all()],
            "task": public_task(leaderboard), "visibility": leaderboard.visibility, "creator_id": None,
            "forum_id": None}


def run_item(run: Run, view: RunView) -> dict[str, Any]:
    """A run of a submission's detail; a public test or benchmark run with its result, as KernelBot (what the
    viewer may see of it: `run_out`)."""
    shown = run_out(run, view)
    item = {"start_time": iso(run.started_at), "end_time": iso(run.finished_at), "mode": run.submission.mode,
            "secret": run.secret, "runner": shown["gpu"], "status": run.status, "score": shown["score"],
            "passed": run.passed, "gpu_type": shown["gpu"],
            # ours: when it was handed to a runner, and where its time went (`serializers.phase_seconds`)
            "dispatched_at": iso(run.dispatched_at), "seconds": shown["seconds"]}
    if not run.secret and run.submission.mode in (SubmissionMode.TEST, SubmissionMode.BENCHMARK):
        item["result"] = run_result(run, view)["runs"][run.submission.mode]["run"]
    return item


def run_row(run: Run, view: RunView) -> dict[str, Any]:
    """A run in the submission list."""
    shown = run_out(run, view)
    return {"gpu_type": shown["gpu"], "score": shown["score"], "secret": run.secret, "status": run.status,
            "passed": run.passed}


def submission_detail(submission: Submission, runs: list[Run], view: RunView, runner_queue: dict | None,
                      last_heartbeat: datetime | None = None) -> dict[str, Any]:
    done, status, error = job_state(runs, view)
    return {
        "id": submission.pk, "leaderboard_id": submission.leaderboard_id,
        "leaderboard_name": submission.leaderboard.name, "file_name": submission.file_name,
        "user_id": str(submission.user_id), "submission_time": submission.created.isoformat(), "done": done,
        "code": submission.code.text, "mode": submission.mode, "runs": [run_item(r, view) for r in runs],
        "job": {"status": status, "error": error, "last_heartbeat": iso(last_heartbeat)},
        "runner_queue": runner_queue,
        "rerun_of": finals.rerun_of(submission),  # ours: a final standings' re-run names its original
    }


def submission_item(detail: dict[str, Any], runs: list[Run]) -> dict[str, Any]:
    """KernelBot's SubmissionItem names (the admin's whole submission) for a RunView.ALL `detail` of `runs` (in its
    order): its job flattened, each run with its compilation (null unless it failed to compile), meta, result and
    system."""
    job = detail["job"]
    return {"submission_id": detail["id"], "job_status": job["status"], "job_error": job["error"],
            "job_last_heartbeat": job["last_heartbeat"],
            "runs": [{**item, "compilation": {"success": False, "stderr": run.error}
                      if run.verdict == "compile_error" else None,
                      "meta": {"success": run.status == RunStatus.SUCCEEDED, "stdout": run.stdout, "stderr": run.stderr,
                               "duration": duration(run)},
                      "result": run.result or {}, "system": run.system_info or {}}
                     for item, run in zip(detail["runs"], runs, strict=True)]}


def run_result(run: Run, view: RunView) -> dict[str, Any]:
    """One GPU's outcome in the shape popcorn prints: results[i].runs[<mode>].run.{stdout,stderr,...}."""
    shown = run_out(run, view)
    body = {"success": run.status == RunStatus.SUCCEEDED, "passed": bool(run.passed), "status": run.status,
            "score": shown["score"], "stdout": shown["stdout"], "stderr": shown["stderr"], "error": shown["error"],
            "duration": duration(run),
            "tests": shown["tests"], "benchmarks": shown["benchmarks"], "profile": shown["profile"]}
    return {"gpu": shown["gpu"], "success": body["success"], "runs": {run.submission.mode: {"run": body}}}


def duration(run: Run) -> float | None:
    return (run.finished_at - run.started_at).total_seconds() if run.finished_at and run.started_at else None


def report(run: Run, view: RunView) -> str:
    """A short markdown report of one run."""
    shown = run_out(run, view)
    lines = [f"## {run.submission.file_name} on {shown['gpu']} ({run.submission.mode}): {run.status}"]
    if shown["error"]:
        lines.append(f"\n{shown['error']}")
    for title, rows in (("Tests", shown["tests"]), ("Benchmarks", shown["benchmarks"])):
        if rows:
            lines += [f"\n### {title}", "| case | status | mean |", "| --- | --- | --- |"]
            lines += [f"| {r.get('spec', '')} | {r.get('status', '')} | "
                      f"{format_ns(r.get('mean'))} |" for r in rows]
    if shown["score"] is not None:
        lines.append(f"\nscore: {shown['score'] * 1e6:.3f} µs")
    if shown["profile"]:
        lines.append(f"\n### Profile\n```\n{shown['profile']}\n```")
    return "\n".join(lines)


def format_ns(value) -> str:
    return "" if value is None else f"{float(value) / 1000:.3f} µs"
