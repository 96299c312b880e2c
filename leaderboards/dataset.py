"""The submissions dataset (issue 28, part 3): closed boards' submissions as one parquet table in the schema of
KernelBot's published data (GPUMODE/kernelbot-data, written by its `/admin export-hf`), plus what each row's run tells
about where and how it ran. It is published data: it holds the submissions whose code the site shows an anonymous
visitor (`Submission.objects.code_visible_to`, the access authority's rule), so only boards past their deadline whose
code is public to everyone export, and their test, benchmark and profile runs and the final standings' re-runs never
do. One row per distinct code (its first such submission; later submissions of the same file add nothing); users who
opted out (`Profile.publish_submissions`) are left out. Front-ends: the admin's leaderboard action, `manage.py
export_dataset`, Discord's export-hf and the board page's download (`public_to_everyone`). `push_to_hub` uploads a
file to a Hugging Face dataset repository with `huggingface_hub` (token from HF_TOKEN)."""

from __future__ import annotations

import io
import os
from collections.abc import Iterable
from datetime import timedelta
from typing import NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.utils import timezone

from .access.authority import code_is_public, may_see_leaderboard
from .errors import Refused
from .models import Leaderboard, Profile, Run, Submission, SubmissionMode, Visibility
from .ranking import interval_from_fields, slower_run

KERNELBOT_FIELDS = [
    ("submission_id", pa.int64()), ("leaderboard_id", pa.int64()), ("problem_name", pa.string()),
    ("user_id", pa.int64()), ("user_name", pa.string()), ("code_id", pa.int64()), ("file_name", pa.string()),
    ("submission_time", pa.timestamp("us", tz="UTC")), ("status", pa.string()), ("score", pa.float64()),
    ("passed", pa.bool_()), ("mode", pa.string()), ("runner", pa.string()), ("code", pa.string()),
]
OUR_FIELDS = [
    ("leaderboard", pa.string()), ("gpu_type", pa.string()), ("device_name", pa.string()),
    ("torch_version", pa.string()), ("driver_version", pa.string()), ("ratio", pa.float64()),
    ("ratio_low", pa.float64()), ("ratio_high", pa.float64()), ("verdict", pa.string()),
]
SCHEMA = pa.schema(KERNELBOT_FIELDS + OUR_FIELDS)


def check_exportable(leaderboard: Leaderboard) -> None:
    if leaderboard.internal:
        raise Refused(f"Leaderboard '{leaderboard.name}' does not exist.", 404)
    if not leaderboard.is_finished:
        raise Refused(f"'{leaderboard.name}' is still open: its submissions are exported once its deadline has passed "
                      f"({leaderboard.deadline:%Y-%m-%d %H:%M} UTC).", 409)
    if not public_to_everyone(leaderboard):
        why = "it is invite-only" if leaderboard.visibility == Visibility.CLOSED else \
            "its code stays private after the deadline (code public after deadline is off)"
        raise Refused(f"'{leaderboard.name}' has no public submissions to export: {why}. The dataset holds only the "
                      "code the site shows everyone.", 409)


def public_to_everyone(leaderboard: Leaderboard) -> bool:
    """Whether anyone may download the board's dataset: an anonymous visitor sees the board and its code."""
    return may_see_leaderboard(AnonymousUser(), leaderboard) and code_is_public(leaderboard)


def published_leaderboards():
    """What the published dataset holds by default: every board anyone may download."""
    return [b for b in Leaderboard.objects.filter(internal=False, deadline__lte=timezone.now(),
                                                  code_public_after_deadline=True)
            .exclude(visibility=Visibility.CLOSED) if public_to_everyone(b)]


def publishes(user) -> bool:
    profile = getattr(user, "profile", None) if user.is_authenticated else None
    return profile is None or profile.publish_submissions


def do_set_publishing(user, publish: bool) -> None:
    """The user's choice: their submissions in published datasets (the default) or left out of every later export."""
    Profile.objects.update_or_create(user=user, defaults={"publish_submissions": publish},
                                     create_defaults={"publish_submissions": publish,
                                                      "display_name": user.get_username()})


def _device(system: dict) -> str:
    device = str(system.get("device") or "")
    return str(system.get("cpu") or device) if device in ("", "cpu") else device


def _scored_run(submission: Submission, runs: list[Run]) -> Run:
    """The run a row describes: for a ranked submission whose runs passed, the one its score comes from (the slower,
    as on every page); else the first that did not pass, else the first. Runs of its first GPU type only."""
    first_gpu = runs[0].gpu_type_id
    runs = [r for r in runs if r.gpu_type_id == first_gpu]
    failing = [r for r in runs if not (r.status == "succeeded" and r.passed)]
    if failing:
        return failing[0]
    if submission.mode == SubmissionMode.LEADERBOARD and len(runs) == 2 and all(r.score is not None for r in runs):
        chosen = slower_run([(r.score, interval_from_fields(r.ratio, r.ratio_low, r.ratio_high)) for r in runs])
        return next(r for r in runs if r.score == chosen[0]
                    and interval_from_fields(r.ratio, r.ratio_low, r.ratio_high) == chosen[1])
    return runs[0]


def dataset_rows(leaderboards: Iterable[Leaderboard]) -> list[dict]:
    boards = list(leaderboards)
    for board in boards:
        check_exportable(board)
    return _rows(Submission.objects.code_visible_to(AnonymousUser()).filter(leaderboard__in=boards))


def snapshot_rows(leaderboards: Iterable[Leaderboard]) -> list[dict]:
    """The private snapshot: every ranked submission of the boards, open or closed, public or not (for a private
    repository only: `do_push_snapshot`); users who opted out are left out here too, final re-runs are not theirs."""
    return _rows(Submission.objects.filter(leaderboard__in=list(leaderboards), mode=SubmissionMode.LEADERBOARD,
                                           final_entry__isnull=True))


def snapshot_leaderboards() -> list[Leaderboard]:
    """KernelBot's scheduled export set: the boards of live competitions (open, a deadline within a year, not
    internal, not '-dev')."""
    horizon = timezone.now() + timedelta(days=365)
    return list(Leaderboard.objects.open().filter(internal=False, deadline__lt=horizon)
                .exclude(name__endswith="-dev").order_by("name"))


def _rows(submissions) -> list[dict]:
    submissions = (submissions.exclude(user__profile__publish_submissions=False)
                   .select_related("user", "code", "problem", "leaderboard").order_by("created", "pk"))
    runs: dict[int, list[Run]] = {}
    ordered = Run.objects.filter(submission__in=submissions).select_related("gpu_type")
    for run in ordered.order_by("submission", "gpu_type", "secret"):
        runs.setdefault(run.submission_id, []).append(run)
    rows, seen = [], set()
    for sub in submissions:
        if sub.code_id in seen or sub.pk not in runs:
            continue
        seen.add(sub.code_id)
        run = _scored_run(sub, runs[sub.pk])
        system = run.system_info or {}
        rows.append({
            "submission_id": sub.pk, "leaderboard_id": sub.leaderboard_id, "problem_name": sub.problem.name,
            "user_id": sub.user_id, "user_name": sub.user.get_username(), "code_id": sub.code_id,
            "file_name": sub.file_name, "submission_time": sub.created, "status": run.status, "score": run.score,
            "passed": run.passed, "mode": sub.mode, "runner": run.runner, "code": sub.code.text,
            "leaderboard": sub.leaderboard.name, "gpu_type": run.gpu_type.name, "device_name": _device(system),
            "torch_version": str(system.get("torch") or ""), "driver_version": str(system.get("driver") or ""),
            "ratio": run.ratio, "ratio_low": run.ratio_low, "ratio_high": run.ratio_high, "verdict": run.verdict})
    return rows


def dataset_table(leaderboards: Iterable[Leaderboard]) -> pa.Table:
    return pa.Table.from_pylist(dataset_rows(leaderboards), schema=SCHEMA)


def do_export_dataset(leaderboards: Iterable[Leaderboard], target: str | os.PathLike | io.IOBase) -> int:
    """Writes the boards' dataset as parquet to `target` (a path or a binary file); returns its row count."""
    table = dataset_table(leaderboards)
    pq.write_table(table, target)
    return table.num_rows


def parquet_bytes(leaderboards: Iterable[Leaderboard]) -> bytes:
    buffer = io.BytesIO()
    do_export_dataset(leaderboards, buffer)
    return buffer.getvalue()


def push_to_hub(data: bytes, repo_id: str, path_in_repo: str, *, token: str | None = None,
                endpoint: str | None = None, private: bool | None = None, only_private: bool = False) -> str:
    """Uploads `data` as `path_in_repo` to the Hugging Face dataset repository `repo_id` (created if missing: private
    or public as `private` says, None the Hub's default) in one commit; returns the commit's URL. The token comes from
    HF_TOKEN unless given; the Hub from HF_ENDPOINT. `only_private`: refused unless the repository is private."""
    from huggingface_hub import HfApi  # noqa: PLC0415 - only the push needs it
    from huggingface_hub.errors import HfHubHTTPError  # noqa: PLC0415

    token = token or os.environ.get("HF_TOKEN", "")
    if not token:
        raise Refused("Set HF_TOKEN (a Hugging Face token with write access) to push the dataset.")
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise Refused(f"'{repo_id}' is not a Hugging Face repository id (owner/name).")
    api = HfApi(endpoint=endpoint or settings.HF_ENDPOINT, token=token)
    try:
        api.create_repo(repo_id, repo_type="dataset", exist_ok=True, private=private)
        if only_private and not api.dataset_info(repo_id).private:
            raise Refused(f"'{repo_id}' is a public repository: a snapshot of live boards goes only to a private "
                          "one.", 409)
        commit = api.upload_file(path_or_fileobj=data, path_in_repo=path_in_repo, repo_id=repo_id,
                                 repo_type="dataset", commit_message=f"KernelBot submissions: {path_in_repo}")
    except HfHubHTTPError as exc:
        raise Refused(f"The Hugging Face Hub refused the upload: {exc}", 502) from exc
    return commit.commit_url


def file_name(leaderboards: Iterable[Leaderboard]) -> str:
    names = sorted(b.name for b in leaderboards)
    return f"{names[0] if len(names) == 1 else 'submissions'}.parquet"


SNAPSHOT_FILE = "active_submissions.parquet"


class Pushed(NamedTuple):
    url: str  # the commit's
    repo_id: str
    rows: int


def do_push_dataset(leaderboards: Iterable[Leaderboard], repo_id: str, filename: str, private: bool) -> Pushed:
    """The public dataset of the boards (`dataset_rows`) pushed to `repo_id`."""
    table = dataset_table(leaderboards)
    return Pushed(push_to_hub(pq_bytes(table), repo_id, filename, private=private), repo_id, table.num_rows)


def do_push_snapshot(leaderboards: Iterable[Leaderboard] | None = None, repository: str | None = None,
                     filename: str = SNAPSHOT_FILE) -> Pushed:
    """A private snapshot of live boards (default: `snapshot_leaderboards`) pushed to a private dataset repository
    (default HF_PRIVATE_DATASET): on an organiser's request, and every 6 hours (`tasks.export_snapshot`)."""
    repository = (repository or settings.HF_PRIVATE_DATASET).strip()
    if not repository:
        raise Refused("Set HF_PRIVATE_DATASET (or name a private repository) for the private snapshot.")
    boards = list(snapshot_leaderboards() if leaderboards is None else leaderboards)
    if not boards:
        raise Refused("No live leaderboard to snapshot.", 409)
    table = pa.Table.from_pylist(snapshot_rows(boards), schema=SCHEMA)
    return Pushed(push_to_hub(pq_bytes(table), repository, filename, private=True, only_private=True), repository,
                  table.num_rows)


def pq_bytes(table: pa.Table) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()
