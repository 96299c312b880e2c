"""Who reads a submission's code: one rule (`access.authority.may_see_code`, `Submission.objects.code_visible_to` as a
queryset), which the site, popcorn, Discord and the published dataset all apply (issue 36, item 1)."""

from __future__ import annotations

import io
import itertools
from datetime import timedelta

import pyarrow.parquet as pq
import pytest
from django.contrib.auth.models import AnonymousUser
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from discordbot import service
from discordbot.identity import user_for_discord
from leaderboards.access.actions import do_create_token
from leaderboards.access.authority import may_see_code, may_see_submission
from leaderboards.access.models import Membership
from leaderboards.models import Final, FinalEntry, Leaderboard, Profile, Run, RunStatus, Submission, Visibility

from ..factories import LeaderboardFactory, UserFactory, submission

pytestmark = pytest.mark.django_db
MODES = ["test", "benchmark", "leaderboard", "profile"]
STATES = [RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.TIMED_OUT,
          RunStatus.CANCELLED, RunStatus.ERROR]


def set_state(sub: Submission, status: str) -> None:
    passed = status == RunStatus.SUCCEEDED
    finished = timezone.now() if status not in (RunStatus.QUEUED, RunStatus.RUNNING) else None
    Run.objects.filter(submission=sub).update(status=status, passed=passed, score=1e-3 if passed else None,
                                              finished_at=finished, verdict="pass" if passed else "")


def close(board: Leaderboard, *, code_public: bool = True) -> None:
    board.deadline, board.code_public_after_deadline = timezone.now() - timedelta(hours=1), code_public
    board.save(update_fields=["deadline", "code_public_after_deadline"])


def rerun_of(original: Submission, code: str) -> Submission:
    """A final standings' re-run of `original` (leaderboards/finals.py). Its code differs here only so that a leak
    would show: a real re-run's code is its original's, which the dataset's one row per code would hide."""
    final = Final.objects.create(leaderboard=original.leaderboard, top_n=1, rounds=1)
    entry = FinalEntry.objects.create(final=final, gpu_type=original.runs.first().gpu_type, submission=original,
                                      user=original.user, board_rank=1, position=0)
    copy = submission(original.leaderboard, original.user, code=code)
    Submission.objects.filter(pk=copy.pk).update(final_entry=entry, final_round=0)
    set_state(copy, RunStatus.SUCCEEDED)
    copy.refresh_from_db()
    return copy


@pytest.fixture
def busy_board(leaderboard):
    """Three users' submissions in every mode and run state, each with its own code; a re-run for the final
    standings; and a ranked submission of a user who opted out of datasets."""
    users = [UserFactory(username=n) for n in ("ann", "ben", "cat")]
    subs = []
    for i, (mode, state) in enumerate(itertools.product(MODES, STATES)):
        sub = submission(leaderboard, users[i % 3], code=f"def custom_kernel(data):  # {mode} {state} {i}\n    ...",
                         mode=mode)
        set_state(sub, state)
        subs.append(sub)
    ranked = next(s for s in subs if s.mode == "leaderboard" and s.runs.first().status == RunStatus.SUCCEEDED)
    subs.append(rerun_of(ranked, "def custom_kernel(data):  # the final re-run\n    ..."))
    quiet = UserFactory(username="quiet")
    Profile.objects.create(user=quiet, publish_submissions=False)
    subs.append(submission(leaderboard, quiet, code="def custom_kernel(data):  # opted out\n    ..."))
    set_state(subs[-1], RunStatus.SUCCEEDED)
    close(leaderboard)
    return leaderboard, subs


def test_the_anonymous_dataset_holds_only_code_the_anonymous_site_shows(busy_board):
    board, subs = busy_board
    anonymous = Client()
    download = anonymous.get(f"/lb/{board.name}/dataset.parquet")
    assert download.status_code == 200
    rows = pq.read_table(io.BytesIO(download.content)).to_pylist()
    assert rows and all(r["code"] for r in rows)
    for row in rows:  # every row's code is what the site shows anyone for that submission
        page = anonymous.get(f"/s/{row['submission_id']}/code")
        assert page.status_code == 200 and page.content.decode() == row["code"], row["submission_id"]
    hidden = [s for s in subs if anonymous.get(f"/s/{s.pk}/code").status_code != 200]
    assert {s.mode for s in hidden} == {"test", "benchmark", "profile", "leaderboard"}  # the re-run is ranked
    assert any(s.is_rerun for s in hidden)
    codes, ids = {r["code"] for r in rows}, {r["submission_id"] for r in rows}
    for sub in hidden:  # and nothing the site hides from anyone is in it
        assert sub.pk not in ids and sub.code.text not in codes, (sub.pk, sub.mode)
    shown = {s.pk for s in subs} - {s.pk for s in hidden}
    assert ids <= shown and len(ids) == len(shown) - 1  # every ranked one but the opted-out user's


@pytest.mark.parametrize("visibility, code_public", [(Visibility.PUBLIC, False), (Visibility.CLOSED, True)])
def test_a_board_whose_code_anonymous_visitors_cannot_read_exports_nothing(leaderboard, client, visibility,
                                                                          code_public):
    finish_one = submission(leaderboard, code="def custom_kernel(data):  # private\n    ...")
    set_state(finish_one, RunStatus.SUCCEEDED)
    leaderboard.visibility = visibility
    leaderboard.save(update_fields=["visibility"])
    close(leaderboard, code_public=code_public)
    with pytest.raises(CommandError, match="has no public submissions to export"):
        call_command("export_dataset", leaderboard.name, out="/dev/null")
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    response = client.post("/admin/leaderboards/leaderboard/", {"action": "export_dataset",
                                                                 "_selected_action": [leaderboard.pk]}, follow=True)
    assert "has no public submissions to export" in response.content.decode()
    assert Client().get(f"/lb/{leaderboard.name}/dataset.parquet").status_code == 404


def test_the_predicates_and_the_querysets_are_one_rule(cpu_pool, demo_task, leaderboard):
    """For every viewer and submission: `may_see_submission` is `visible_to`, `may_see_code` is `code_visible_to`."""
    owner, stranger, member, staff = (UserFactory(username=n) for n in ("owner", "stranger", "member", "staff"))
    staff.is_staff = True
    staff.save(update_fields=["is_staff"])
    boards = {"open": leaderboard}
    for name, visibility, code_public in (("closed-public-code", Visibility.PUBLIC, True),
                                          ("closed-private-code", Visibility.PUBLIC, False),
                                          ("invite-only", Visibility.CLOSED, True),
                                          ("unlisted", Visibility.UNLISTED, True)):
        boards[name] = LeaderboardFactory(name=name, problem=leaderboard.problem, gpu_types=[cpu_pool.cpu],
                                          visibility=visibility)
        close(boards[name], code_public=code_public)
    leaderboard.code_public_after_deadline = True  # not yet public: the deadline has not passed
    leaderboard.save(update_fields=["code_public_after_deadline"])
    Membership.objects.create(leaderboard=boards["invite-only"], user=member)
    subs = [submission(board, user, code=f"{name} {mode} {user}", mode=mode)
            for name, board in boards.items() for mode in MODES for user in (owner, member)]
    subs += [rerun_of(s, f"re-run of {s.pk}") for s in subs if s.mode == "leaderboard" and s.user == owner]
    for viewer in (AnonymousUser(), owner, stranger, member, staff):
        visible = set(Submission.objects.visible_to(viewer).values_list("pk", flat=True))
        readable = set(Submission.objects.code_visible_to(viewer).values_list("pk", flat=True))
        for sub in Submission.objects.select_related("leaderboard").filter(pk__in=[s.pk for s in subs]):
            assert may_see_submission(viewer, sub) == (sub.pk in visible), (viewer, sub.leaderboard.name, sub.mode)
            assert may_see_code(viewer, sub) == (sub.pk in readable), (viewer, sub.leaderboard.name, sub.mode)
    anonymous_reads = {(s.leaderboard.name, s.mode, s.is_rerun) for s in
                       Submission.objects.code_visible_to(AnonymousUser()).select_related("leaderboard")}
    assert anonymous_reads == {("closed-public-code", "leaderboard", False), ("unlisted", "leaderboard", False)}


def test_the_site_popcorn_and_discord_read_code_by_the_same_rule(leaderboard, client):
    owner = user_for_discord(7001, "owner")
    stranger = user_for_discord(7002, "stranger")
    ranked = submission(leaderboard, owner, code="def custom_kernel(data):  # ranked\n    ...")
    trial = submission(leaderboard, owner, code="def custom_kernel(data):  # a test run\n    ...", mode="test")
    cli = {"X-Popcorn-Cli-Id": do_create_token(stranger)[1]}
    client.force_login(stranger)

    def reads(sub: Submission) -> list[bool]:
        discord_ok = True
        try:
            service.get_submission(service.Member(7002, "stranger"), sub.pk)
        except service.BotError:
            discord_ok = False
        return [client.get(f"/s/{sub.pk}/code").status_code == 200,
                client.get(f"/popcorn/user/submissions/{sub.pk}", headers=cli).status_code == 200, discord_ok]

    assert reads(ranked) == reads(trial) == [False] * 3  # before the deadline
    close(leaderboard)
    assert reads(ranked) == [True] * 3 and reads(trial) == [False] * 3
