"""Who may see what: the one authority that every front-end calls (site pages, /api/v1, popcorn, the SSE streams,
the websockets, and the Discord bot to come). Like zulip's `access_message`, each `access_*` returns the object or
raises `AccessDenied`, which each front-end maps once to its own answer; `Leaderboard.objects.visible_to(user)`
and `Submission.objects.visible_to(user)` are the same rules as querysets.

- Staff see everything but the internal leaderboards of pool health checks (nobody sees those outside the admin).
- A leaderboard is visible unless it is closed; a closed one to its members (invite codes).
- A submission is visible to its owner, and when ranked (mode `leaderboard`) to whoever sees its leaderboard; a final
  standings' re-run (`Submission.final_entry`, leaderboards/finals.py) only to its owner and staff. The owner's own
  submissions (`Submission.objects.made_by`) are those they made: the re-runs are the finals', never listed as theirs
  nor theirs to delete (`access_submission(for_change=True)`).
- Its code, and its public runs' details (error, logs, checker messages), are the owner's; everyone who sees the
  submission reads them once the leaderboard's code is public (`code_public_after_deadline`, after the deadline).
  `Submission.objects.code_visible_to(user)` is `may_see_code` as a queryset: the published dataset
  (leaderboards/dataset.py) holds what it gives the anonymous visitor, no more.
- A secret run's details are for staff only; everyone else sees its outcome class (`leaderboards.serializers`).
- The pre-check's findings (KernelGuard, `leaderboards.precheck`) are for staff only, the owner included: a second
  opinion for organisers beside the verdict, not a guide to writing around the detector's rules.
"""

from __future__ import annotations

from enum import IntEnum

from leaderboards.errors import AccessDenied, SubmissionRejected
from leaderboards.models import FinalEntry, Leaderboard, Run, Submission, SubmissionMode, Visibility

from .cache import board_key, cached
from .models import Membership


class RunView(IntEnum):
    """How much of a submission's runs a viewer sees."""

    OUTCOME = 0  # status, outcome class, pass/fail; public runs' score, progress and timings
    DETAILS = 1  # and public runs' error, logs and checker messages (the owner; everyone once the code is public)
    ALL = 2  # and the secret runs' details (staff)


def is_owner(user, submission: Submission) -> bool:
    return user.is_authenticated and submission.user_id == user.pk


def may_see_leaderboard(user, leaderboard: Leaderboard) -> bool:
    if leaderboard.internal:
        return False
    if leaderboard.visibility != Visibility.CLOSED or user.is_staff:
        return True
    return user.is_authenticated and Membership.objects.filter(leaderboard=leaderboard, user=user).exists()


def may_see_submission(user, submission: Submission) -> bool:
    if user.is_staff or is_owner(user, submission):
        return True
    return (submission.mode == SubmissionMode.LEADERBOARD and submission.final_entry_id is None
            and may_see_leaderboard(user, submission.leaderboard))


def code_is_public(leaderboard: Leaderboard) -> bool:
    return leaderboard.code_public_after_deadline and leaderboard.is_finished


def run_view(user, submission: Submission) -> RunView:
    """For a viewer who may see the submission."""
    if user.is_staff:
        return RunView.ALL
    if is_owner(user, submission) or code_is_public(submission.leaderboard):
        return RunView.DETAILS
    return RunView.OUTCOME


def may_see_code(user, submission: Submission) -> bool:
    return may_see_submission(user, submission) and run_view(user, submission) >= RunView.DETAILS


def rerun_of(submission: Submission) -> int | None:
    """The id of the submission a final standings' re-run copies (None for any other)."""
    if not submission.is_rerun:
        return None
    return FinalEntry.objects.filter(pk=submission.final_entry_id).values_list("submission_id", flat=True).first()


def may_see_run_details(view: RunView, run: Run) -> bool:
    return view is RunView.ALL or (view is RunView.DETAILS and not run.secret)


def may_see_precheck(user) -> bool:
    return user.is_staff


def _by_name(queryset, name: str) -> Leaderboard | None:
    """Names match case-insensitively (popcorn-cli lower-cases them); an exact match wins."""
    found = list(queryset.filter(name__iexact=name)[:5])
    return next((b for b in found if b.name == name), found[0] if found else None)


def access_leaderboard(user, name: str, *, for_submit: bool = False, queryset=None,
                       after_deadline: bool = False) -> Leaderboard:
    """The leaderboard `name` if `user` may see it, or a 404 (the same as for a name that does not exist).
    `for_submit`: also open now (403 before its start or after its deadline), refused as SubmissionRejected like
    every other reason a submission is refused; read from the cache, since every submission asks (the bare row:
    no problem definition). `after_deadline`: an admin's submission, taken after the deadline too."""
    refuse = SubmissionRejected if for_submit else AccessDenied
    if for_submit:
        board = cached(board_key(name), lambda: _by_name(Leaderboard.objects.all(), name))
    else:
        board = _by_name(queryset if queryset is not None else Leaderboard.objects.all(), name)
    if board is None or not may_see_leaderboard(user, board):
        raise refuse(f"Unknown leaderboard '{name}'.", 404)
    if for_submit:
        if not user.is_authenticated:
            raise refuse("Log in to submit.", 401)
        if not board.has_started:
            raise refuse(f"Leaderboard '{board.name}' opens at {board.starts_at:%Y-%m-%d %H:%M} UTC; it does not "
                         "accept submissions yet.", 403)
        if board.is_finished and not after_deadline:
            raise refuse(f"Leaderboard '{board.name}' closed at {board.deadline:%Y-%m-%d %H:%M} UTC; it no longer "
                         "accepts submissions.", 403)
    return board


def access_submission(user, submission_id: int, *, for_code: bool = False, for_change: bool = False,
                      queryset=None) -> Submission:
    """The submission if `user` may see it, or AccessDenied: 404 when it is not visible (as if it did not exist)
    or, `for_change` (delete), not the user's own; 403 `for_change` for a final standings' re-run, which is the
    finals'; 403 `for_code` when it is visible but its code is not."""
    queryset = queryset if queryset is not None else Submission.objects.select_related("leaderboard")
    submission = queryset.filter(pk=submission_id).first()
    if (submission is None or not may_see_submission(user, submission)
            or (for_change and not is_owner(user, submission))):
        raise AccessDenied(f"Submission {submission_id} not found.", 404)
    if for_change and submission.is_rerun:
        raise AccessDenied(f"Submission {submission_id} is a re-run of your submission {rerun_of(submission)} for the "
                           "final standings: it belongs to the finals and cannot be deleted.", 403)
    if for_code and not may_see_code(user, submission):
        later = ", and to everyone after the deadline" if submission.leaderboard.code_public_after_deadline else ""
        raise AccessDenied(f"This submission's code is visible to its author and staff only{later}.", 403)
    return submission
