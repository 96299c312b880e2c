"""The JSON shapes popcorn-cli reads, built from our models; shared by the polled and the streamed routes."""

from __future__ import annotations

from typing import Any

from leaderboards.models import TERMINAL_STATUSES, Leaderboard, Run, RunStatus, Submission

PUBLIC_TASK_KEYS = ("lang", "description", "templates", "tests", "benchmarks", "ranking_by", "test_timeout",
                    "benchmark_timeout", "ranked_timeout", "multi_gpu")
FAILED_JOB = (RunStatus.FAILED, RunStatus.TIMED_OUT, RunStatus.HACKED, RunStatus.ERROR, RunStatus.CANCELLED)


def public_task(leaderboard: Leaderboard) -> dict[str, Any]:
    """Only what a competitor may see: never the secret seed, never file contents."""
    definition = leaderboard.problem.definition
    task = {k: definition[k] for k in PUBLIC_TASK_KEYS if k in definition}
    task["files"] = sorted(definition.get("files", {}))
    return task


def leaderboard_item(leaderboard: Leaderboard) -> dict[str, Any]:
    return {"id": leaderboard.pk, "name": leaderboard.name, "description": leaderboard.description,
            "deadline": leaderboard.deadline.isoformat(), "gpu_types": [g.name for g in leaderboard.gpu_types.all()],
            "task": public_task(leaderboard)}


def iso(value) -> str | None:
    return value.isoformat() if value else None


def job_state(runs: list[Run]) -> tuple[bool, str, str]:
    """(done, job status, error) from one snapshot of the runs, so `done` and the final status always agree."""
    done = bool(runs) and all(r.status in TERMINAL_STATUSES for r in runs)
    failed = next((r for r in runs if r.status in FAILED_JOB), None)
    if failed is not None and done:
        return True, failed.status, failed.error
    if done:
        return True, "succeeded", ""
    if any(r.status == RunStatus.RUNNING for r in runs):
        return False, "running", ""
    return False, "pending", ""


def run_item(run: Run) -> dict[str, Any]:
    return {"start_time": iso(run.started_at), "end_time": iso(run.finished_at), "mode": run.submission.mode,
            "secret": run.secret, "runner": run.gpu_type.name, "status": run.status,
            "score": None if run.secret else run.score, "passed": run.passed, "gpu_type": run.gpu_type.name}


def submission_detail(submission: Submission, runs: list[Run], runner_queue: dict | None) -> dict[str, Any]:
    done, status, error = job_state(runs)
    return {
        "id": submission.pk, "leaderboard_id": submission.leaderboard_id,
        "leaderboard_name": submission.leaderboard.name, "file_name": submission.file_name,
        "user_id": str(submission.user_id), "submission_time": submission.created.isoformat(), "done": done,
        "code": submission.code.text, "mode": submission.mode, "runs": [run_item(r) for r in runs],
        "job": {"status": status, "error": error}, "runner_queue": runner_queue,
    }


def run_result(run: Run) -> dict[str, Any]:
    """One GPU's outcome in the shape popcorn prints: results[i].runs[<mode>].run.{stdout,stderr,...}."""
    result = run.result or {}
    body = {"success": run.status == RunStatus.SUCCEEDED, "passed": bool(run.passed), "status": run.status,
            "score": run.score, "stdout": run.stdout, "stderr": run.stderr, "error": run.error,
            "duration": (run.finished_at - run.started_at).total_seconds()
            if run.finished_at and run.started_at else None,
            "tests": result.get("tests", []), "benchmarks": result.get("benchmarks", []),
            "profile": result.get("profile")}
    return {"gpu": run.gpu_type.name, "success": body["success"], "runs": {run.submission.mode: {"run": body}}}


def report(run: Run) -> str:
    """A short markdown report of one run."""
    result = run.result or {}
    lines = [f"## {run.submission.file_name} on {run.gpu_type.name} ({run.submission.mode}): {run.status}"]
    if run.error:
        lines.append(f"\n{run.error}")
    for title, rows in (("Tests", result.get("tests") or []), ("Benchmarks", result.get("benchmarks") or [])):
        if rows:
            lines += [f"\n### {title}", "| case | status | mean |", "| --- | --- | --- |"]
            lines += [f"| {r.get('spec', '')} | {r.get('status', '')} | "
                      f"{format_ns(r.get('mean'))} |" for r in rows]
    if run.score is not None:
        lines.append(f"\nscore: {run.score * 1e6:.3f} µs")
    if result.get("profile"):
        lines.append(f"\n### Profile\n```\n{result['profile']}\n```")
    return "\n".join(lines)


def format_ns(value) -> str:
    return "" if value is None else f"{float(value) / 1000:.3f} µs"
