"""API v1 shapes for leaderboards, rankings and submissions."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ninja import Field, Schema


class LeaderboardOut(Schema):
    id: int
    name: str
    description: str
    deadline: datetime
    is_open: bool
    gpu_types: list[str]
    lang: str
    ranking_by: str
    templates: dict[str, str]
    task: dict[str, Any]


class RankingEntryOut(Schema):
    rank: int
    user: str
    score: float = Field(description="Seconds: the time of the submission's public or secret run, whichever ranks "
                         "lower (the larger ratio to the reference; the longer time when a run has none).")
    ratio: float | None = Field(description="Time / the problem's reference time, measured interleaved; what the "
                                "board ranks on when every entry has one.")
    ratio_low: float | None = Field(description="95 % interval of the ratio, low end.")
    ratio_high: float | None
    tied: bool = Field(description="Statistically tied with the entry ranked just above.")
    submission_id: int
    submitted_at: datetime


class RankingPageOut(Schema):
    leaderboard: str
    gpu: str
    count: int
    page: int
    page_size: int
    results: list[RankingEntryOut]


class FinalEntryOut(Schema):
    gpu: str
    rank: int | None = Field(description="Final rank from the re-runs; null when the entry dropped out.")
    board_rank: int = Field(description="Its rank on the board when the re-verification started.")
    user: str
    submission_id: int
    score: float | None = Field(description="Seconds: geometric mean of the re-runs' times.")
    ratio: float | None = Field(description="Geometric mean of the re-runs' ratios to the reference.")
    ratio_low: float | None
    ratio_high: float | None
    tied: bool = Field(description="Statistically tied with the entry ranked just above.")
    dropped: bool = Field(description="A re-run on fresh inputs did not pass.")
    reason: str | None = Field(description="Why it dropped out: only for its author and staff.")


class FinalOut(Schema):
    id: int
    status: str
    top_n: int
    rounds: int
    started: datetime
    finished: datetime | None
    published: datetime | None
    entries: list[FinalEntryOut]


class StandingsOut(Schema):
    leaderboard: str
    provisional: bool = Field(description="Past the deadline and not yet re-verified: the board's ranks may change.")
    published: FinalOut | None = Field(description="The final standings, re-verified on fresh inputs.")
    running: dict[str, int] | None = Field(description="A re-verification under way: runs done and planned.")


class QueueOut(Schema):
    runner: str
    gpu: str
    queued_jobs: int
    position: int
    eta_seconds: int


class CaseOut(Schema):
    spec: str = ""
    status: str = ""
    mean: float | None = None
    message: str | None = None


class ProblemErrorOut(Schema):
    error: str = Field(description="the problem's own code failed: <where>: <exception>: <message>")
    where: str = Field(description="generate_input, ref_kernel or check_implementation")
    traceback: str


class RunOut(Schema):
    """`leaderboards.serializers.run_out`: a secret run shows its outcome class only, except to staff; a public
    run's error, logs and checker messages show to its author (and to everyone once the code is public)."""

    id: int
    gpu: str
    secret: bool
    status: str
    outcome: str | None = Field(description="When finished: passed, wrong_output, timed_out, crashed, "
                                "limit_exceeded, rejected, not_evaluated, cancelled (stopped by an organiser; never "
                                "scored) or problem_broken (the problem's own code failed; not the submission's "
                                "fault, not charged).")
    passed: bool | None
    score: float | None
    ratio: float | None = Field(description="Time / the reference's time, with its 95 % interval below.")
    ratio_low: float | None
    ratio_high: float | None
    error: str
    queued_at: datetime
    dispatched_at: datetime | None = Field(description="When its current attempt got a device: a node agent claimed it "
                                           "(for a remote pool: when the service was handed it).")
    started_at: datetime | None
    finished_at: datetime | None
    seconds: dict[str, float] = Field(
        description="Where the run's time went, in order: queue (waiting for a device: queued to dispatched), "
        "dispatch (from then until the agent has the job), harness_start (the harness's parent and its sandboxed "
        "child up, torch imported), device_context, problem (loading the problem and calibrating data movement), "
        "import (the submission's), tests, reference (starting the reference's own child), benchmarks, ranked, "
        "teardown (profile in profile runs). Only the phases the run went through; the harness's phases only where "
        "its timings may be seen (not a secret run's, except to staff).")
    progress: dict[str, Any]
    tests: list[CaseOut]
    benchmarks: list[CaseOut]
    stdout: str
    stderr: str
    problem_error: ProblemErrorOut | None = Field(
        None, description="Staff only: how the problem's own code failed (outcome problem_broken); everyone else "
        "reads the plain error \"this problem is broken; the organisers have been told\".")


class RerunOfOut(Schema):
    submission_id: int = Field(description="The submission this re-runs (its author's, made before the deadline).")
    round: int = Field(description="Which re-run of it this is, from 1.")
    final_id: int = Field(description="The final standings it was made for.")


class StandingOut(Schema):
    score: float = Field(description="As in `scores`.")
    ratio: float | None = Field(description="The ranked ratio to the reference (the run `score` comes from), with its "
                                "95 % interval: what the board ranks on.")
    ratio_low: float | None
    ratio_high: float | None = Field(description="null: unbounded.")
    rank: int | None = Field(description="Its rank on the board while it is its user's entry there; else null.")
    tied: bool = Field(description="Statistically tied with the entry ranked just above (the board's ≈).")


class SubmissionOut(Schema):
    id: int
    leaderboard: str
    file_name: str
    mode: str
    created: datetime
    done: bool
    status: str
    rerun_of: RerunOfOut | None = Field(
        None, description="Set on a final standings' re-run (a copy the platform made after the deadline, which its "
        "author and staff may read): what it re-runs. It is ranked on no board, counts in no quota, is never listed "
        "as its author's and cannot be deleted by them; null for every submission a user made.")
    score: float | None = Field(description="Seconds: the submission's one score, as the board, its page and the "
                                "list show it (its best GPU type's; see `scores`); null until it has one.")
    scores: dict[str, float] = Field(description="GPU type → the submission's score there: for a ranked submission "
                                     "the time of its public or secret run, whichever ranks lower (the larger "
                                     "ratio to the reference; the longer time when a run has none); otherwise its "
                                     "public run's time.")
    standing: dict[str, StandingOut] = Field(
        default_factory=dict, description="GPU type → what ranks the submission there, as the board shows it.")
    runs: list[RunOut]
    queue: QueueOut | None


class SubmissionListItem(Schema):
    id: int
    leaderboard: str
    file_name: str
    mode: str
    created: datetime
    done: bool
    status: str
    score: float | None


class SubmissionPageOut(Schema):
    count: int
    results: list[SubmissionListItem]


class DeletedOut(Schema):
    status: str
    submission_id: int


class LocalProblemOut(Schema):
    name: str
    version: int
    content_hash: str


class LocalHarnessOut(Schema):
    url: str = Field(description="Where the harness tarball is (the one remote runners fetch).")
    version: str = Field(description="sha256 over the tarball's file names and contents.")


class LocalJobOut(Schema):
    job: dict[str, Any] = Field(description="The harness job (runners/harness/contract.py) without workdir, gpus, "
                                "sandbox_uid and nonce; its seed is the task's public one.")
    timeout_s: int


class LocalTaskOut(Schema):
    leaderboard: str
    problem: LocalProblemOut
    harness: LocalHarnessOut
    files: dict[str, str] = Field(description="The task's files, the submission left out.")
    submission_name: str
    jobs: dict[str, LocalJobOut] = Field(description="Per mode (test, benchmark).")
