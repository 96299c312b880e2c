"""Issue 23: a run whose problem's own code failed (the harness's `problem-error` flag) ends once, is not the
competitor's failure nor charged to their quota; competitors read only the plain PROBLEM_BROKEN on every front-end,
staff read the error and traceback, and the organisers are told once per problem version (admin, Discord)."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import AnonymousUser
from rich.console import Console

from discordbot import announce, service
from discordbot.models import Announcement, Guild
from kernelbot.cli.main import status_table
from leaderboards import lifecycle
from leaderboards.access.actions import check_may_submit, do_create_token
from leaderboards.access.authority import RunView, run_view
from leaderboards.errors import SubmissionRejected
from leaderboards.models import Problem, Run, RunAttempt, RunStatus, SubmissionQuota
from leaderboards.serializers import Outcome, job_state, problem_error_detail, run_out
from runners.harness.result import PROBLEM_BROKEN, PROBLEM_ERROR_FLAG, Result

from ..factories import UserFactory, ranked_result, submission
from .test_lifecycle import dispatch

pytestmark = pytest.mark.django_db
SECRET = "SECRET-INPUT-0.4242"  # what the problem's message and traceback may show of its inputs
TRACEBACK = (f'Traceback (most recent call last):\n  File "reference.py", line 12, in generate_input\n'
             f"ValueError: size {SECRET} is not a power of two")
REPORT_CHANNEL_ID = 900_000_000_000_000_011


def problem_error_result(where: str = "generate_input") -> dict:
    """What the harness reports when the problem's own code raised in its trusted parent (`Result.as_dict`: its
    `extra` travels at the top level), with a case, logs and a message that hold what competitors must not read."""
    return {"event": "result", "status": "error", "verdict": "fail", "passed": False,
            "flags": [PROBLEM_ERROR_FLAG], "tests": [{"spec": "size: 3", "status": "fail", "message": SECRET}],
            "benchmarks": [], "system": {"device": "cpu"}, "stdout": f"out {SECRET}", "stderr": f"err {SECRET}",
            "error": f"the problem's own code failed: {where}: ValueError: size {SECRET} is not a power of two",
            "problem_error": {"where": where, "traceback": TRACEBACK}}


def test_the_harness_result_is_read_as_the_harness_writes_it(leaderboard):
    """The contract pinned against the harness's own writer rather than a hand-made dict."""
    result = Result(mode="test", protocol="kernelbot", status="error", sandbox={"backend": "test"})
    result.fail("fail", "the problem's own code failed: ref_kernel: KeyError: 'n'")
    result.flags.append(PROBLEM_ERROR_FLAG)
    result.extra["problem_error"] = {"where": "ref_kernel", "traceback": TRACEBACK}
    run = submission(leaderboard, mode="test").runs.get()
    assert lifecycle.do_ingest_result(run.pk, dispatch(run), json.loads(json.dumps(result.as_dict())))
    run.refresh_from_db()
    assert run.status == RunStatus.ERROR and run.problem_error
    assert problem_error_detail(run) == {"error": "the problem's own code failed: ref_kernel: KeyError: 'n'",
                                         "where": "ref_kernel", "traceback": TRACEBACK}


def break_runs(sub) -> None:
    for run in sub.runs.all():
        assert lifecycle.do_ingest_result(run.pk, dispatch(run), problem_error_result())


def bearer(user) -> dict[str, str]:
    return {"Authorization": f"Bearer {do_create_token(user)[1]}"}


@pytest.fixture
def owner(db):
    return UserFactory(username="owner")


@pytest.fixture
def broken(leaderboard, owner):
    sub = submission(leaderboard, user=owner)
    break_runs(sub)
    return sub


@pytest.fixture
def report_guild(db):
    return Guild.objects.create(guild_id=1234, name="gpu-mode", report_channel_id=REPORT_CHANNEL_ID)


def test_a_problem_error_ends_the_run_once_without_retry_or_infrastructure_failure(
        leaderboard, sync_queue, django_capture_on_commit_callbacks, settings):
    settings.RUN_MAX_ATTEMPTS = 3
    run = submission(leaderboard, mode="test").runs.get()
    attempt = dispatch(run)
    with django_capture_on_commit_callbacks(execute=True):
        assert lifecycle.do_ingest_result(run.pk, attempt, problem_error_result())
    assert not lifecycle.do_ingest_result(run.pk, attempt, problem_error_result())  # the same result again
    run.refresh_from_db()
    assert (run.status, run.problem_error, run.attempt, run.infra_failures) == (RunStatus.ERROR, True, 1, 0)
    assert run.error == PROBLEM_BROKEN and run.passed is None and run.verdict == "" and run.finished_at
    assert run.status_deadline is None  # terminal: the reaper leaves it alone
    (only,) = RunAttempt.objects.filter(run=run)
    assert only.outcome == RunStatus.ERROR and "generate_input: ValueError" in only.reason
    assert "gave up" not in run.error and "retrying" not in run.error


def test_the_problem_version_is_marked_broken_with_the_latest_error(leaderboard, broken):
    problem = Problem.objects.get(pk=leaderboard.problem_id)
    assert problem.broken_since is not None and problem.broken_run.submission == broken
    assert "generate_input: ValueError" in problem.broken_error and TRACEBACK in problem.broken_error
    first = problem.broken_since
    later = submission(leaderboard).runs.get(secret=False)
    lifecycle.do_ingest_result(later.pk, dispatch(later), problem_error_result("check_implementation"))
    problem.refresh_from_db()
    assert problem.broken_since == first and problem.broken_run == later  # since the first; the latest error
    assert "check_implementation" in problem.broken_error
    assert lifecycle.do_mark_problem_fixed(problem) and not lifecycle.do_mark_problem_fixed(problem)
    problem.refresh_from_db()
    assert (problem.broken_since, problem.broken_error, problem.broken_run) == (None, "", None)


def test_requeue_clears_the_runs_problem_error(broken):
    run = broken.runs.get(secret=False)
    lifecycle.do_requeue_run(run)
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and not run.problem_error and run.result == {}


@pytest.mark.parametrize("viewer", ["owner", "stranger", "anonymous"])
def test_competitors_read_only_the_plain_message(broken, owner, viewer):
    user = {"owner": owner, "stranger": UserFactory(username="stranger"), "anonymous": AnonymousUser()}[viewer]
    view = run_view(user, broken)
    runs = list(broken.runs.select_related("gpu_type"))
    for run in runs:
        shown = run_out(run, view)
        assert shown["outcome"] == Outcome.PROBLEM_BROKEN and shown["error"] == PROBLEM_BROKEN
        assert shown["problem_error"] is None and shown["tests"] == [] and shown["stdout"] == ""
        assert SECRET not in json.dumps(shown, default=str) and "Traceback" not in json.dumps(shown, default=str)
    assert job_state(runs, view) == (True, RunStatus.ERROR, PROBLEM_BROKEN)


def test_staff_read_the_error_and_traceback(broken):
    shown = run_out(broken.runs.select_related("gpu_type").get(secret=True), RunView.ALL)
    assert shown["outcome"] == Outcome.PROBLEM_BROKEN and "generate_input: ValueError" in shown["error"]
    assert shown["problem_error"] == {"error": shown["error"], "where": "generate_input", "traceback": TRACEBACK}


def test_the_api_shows_the_owner_the_message_and_staff_the_traceback(client, broken, owner):
    body = client.get(f"/api/v1/submissions/{broken.pk}", headers=bearer(owner)).json()
    assert {r["error"] for r in body["runs"]} == {PROBLEM_BROKEN}
    assert {r["outcome"] for r in body["runs"]} == {Outcome.PROBLEM_BROKEN}
    assert all(r["problem_error"] is None for r in body["runs"])
    assert SECRET not in json.dumps(body) and "Traceback" not in json.dumps(body)
    staff = client.get(f"/api/v1/submissions/{broken.pk}", headers=bearer(UserFactory(is_staff=True))).json()
    assert all(r["problem_error"]["traceback"] == TRACEBACK for r in staff["runs"])
    popcorn = client.get(f"/popcorn/user/submissions/{broken.pk}",
                         headers={"X-Popcorn-Cli-Id": do_create_token(owner)[1]})
    assert popcorn.status_code == 200 and popcorn.json()["job"]["error"] == PROBLEM_BROKEN
    assert SECRET not in popcorn.content.decode() and "Traceback" not in popcorn.content.decode()


def test_the_submission_page_shows_the_owner_the_message_and_staff_the_traceback(client, broken, owner):
    client.force_login(owner)
    page = client.get(f"/s/{broken.pk}/").content.decode()
    assert PROBLEM_BROKEN in page and SECRET not in page and "Traceback" not in page
    client.force_login(UserFactory(username="boss", is_staff=True))
    page = client.get(f"/s/{broken.pk}/").content.decode()
    assert "Traceback" in page and "generate_input" in page


def test_discord_status_report_and_cli_show_the_plain_message(broken):
    shown = service.progress(broken.pk, public=True)
    assert shown.done and PROBLEM_BROKEN in shown.content and SECRET not in shown.content
    assert PROBLEM_BROKEN in shown.report and SECRET not in shown.report and "Traceback" not in shown.report
    private = service.progress(broken.pk, public=False)
    assert PROBLEM_BROKEN in private.content and SECRET not in private.content + private.report
    view = run_view(broken.user, broken)
    runs = [run_out(r, view) for r in broken.runs.select_related("gpu_type")]
    console = Console(record=True, width=200)
    console.print(status_table({"id": broken.pk, "file_name": broken.file_name, "leaderboard": "lb",
                                "mode": broken.mode, "status": "error", "runs": runs, "done": True}))
    text = console.export_text()
    assert PROBLEM_BROKEN[:50] in text and SECRET not in text


def test_a_broken_run_is_not_charged_to_the_quota(leaderboard, owner):
    SubmissionQuota.objects.create(leaderboard=leaderboard, kind="test", max_submissions=1, window_seconds=3600)
    break_runs(submission(leaderboard, user=owner, mode="test"))
    check_may_submit(owner, leaderboard, "test")  # the broken one does not count
    failed = submission(leaderboard, user=owner, mode="test").runs.get()
    lifecycle.do_ingest_result(failed.pk, dispatch(failed), ranked_result([1000.0], "fail"))
    with pytest.raises(SubmissionRejected) as refused:
        check_may_submit(owner, leaderboard, "test")  # the competitor's own failure does
    assert refused.value.status == 429


def test_the_admin_shows_staff_the_traceback_and_marks_the_problem(admin_client, broken, leaderboard):
    run = broken.runs.get(secret=False)
    page = admin_client.get(f"/admin/leaderboards/run/{run.pk}/change/").content.decode()
    assert "generate_input" in page and "Traceback (most recent call last)" in page and PROBLEM_BROKEN in page
    problems = admin_client.get("/admin/leaderboards/problem/").content.decode()
    assert "⚠ broken" in problems
    boards = admin_client.get("/admin/leaderboards/leaderboard/").content.decode()
    assert "⚠ broken" in boards
    problem_page = admin_client.get(f"/admin/leaderboards/problem/{leaderboard.problem_id}/change/").content.decode()
    assert "Traceback (most recent call last)" in problem_page and "Mark fixed" in problem_page
    url = f"/admin/leaderboards/problem/{leaderboard.problem_id}/do/mark_fixed/"
    assert admin_client.post(url).status_code == 302
    assert Problem.objects.get(pk=leaderboard.problem_id).broken_since is None


def test_discord_tells_the_report_channel_once_per_problem_version(leaderboard, broken, report_guild, settings):
    Guild.objects.create(guild_id=99, name="no report channel")  # told nothing: nowhere to post
    again = broken.runs.get(secret=False)  # the same result ingested twice, and another submission breaking too
    assert not lifecycle.do_ingest_result(again.pk, again.attempt, problem_error_result())
    break_runs(submission(leaderboard))
    (claimed,) = announce.claim_broken_problems()
    assert claimed.channel_id == REPORT_CHANNEL_ID and str(leaderboard.problem) in claimed.text
    assert "generate_input" in claimed.text and SECRET not in claimed.text and "Traceback" not in claimed.text
    assert announce.claim_broken_problems() == []  # claimed: no other bot process or later sweep posts it again
    assert Announcement.objects.count() == 1
    # never posted (the bot died): claimed again once stale, still for the report channel
    settings.DISCORD_ANNOUNCE_RETRY_SECONDS = 0
    (stale,) = announce.claim_stale()
    assert stale.channel_id == REPORT_CHANNEL_ID
    # fixed, then broken again: the organisers are told again
    assert lifecycle.do_mark_problem_fixed(leaderboard.problem)
    break_runs(submission(leaderboard))
    assert len(announce.claim_broken_problems()) == 1 and Announcement.objects.count() == 2


def test_other_error_results_still_retry(leaderboard, settings):
    settings.RUN_MAX_ATTEMPTS = 2
    run = submission(leaderboard, mode="test").runs.get()
    result = {**problem_error_result(), "flags": []}
    assert lifecycle.do_ingest_result(run.pk, dispatch(run), result)
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.infra_failures == 1 and not run.problem_error
    assert not Problem.objects.get(pk=leaderboard.problem_id).broken_since
    assert Run.objects.filter(problem_error=True).count() == 0


def test_a_busy_device_is_the_runners_failure_retried_with_the_holders_on_record(leaderboard, settings):
    """Issue 34: an out-of-memory while other processes held the device (the harness's device-busy result) is
    retried like any infrastructure failure, never a problem error nor the competitor's fail; the attempt's reason
    names the holders for organisers."""
    from runners.harness.device import Holder

    settings.RUN_MAX_ATTEMPTS = 3
    run = submission(leaderboard, mode="test").runs.get()
    said = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    result = Result(mode="test", protocol="kernelbot").device_busy([Holder(4242, "alice", 70000 << 20, "0")], said)
    number = dispatch(run)
    assert lifecycle.do_ingest_result(run.pk, number, json.loads(json.dumps(result.as_dict())))
    run.refresh_from_db()
    assert (run.status, run.infra_failures, run.problem_error, run.passed) == (RunStatus.QUEUED, 1, False, None)
    reason = RunAttempt.objects.get(run=run, number=number).reason
    assert "other processes held 70,000 MiB of it: pid 4242 (alice, 70,000 MiB on device 0)" in reason
    assert not Problem.objects.get(pk=leaderboard.problem_id).broken_since


def test_an_out_of_memory_error_nobody_could_measure_is_tried_once_more_and_charged_to_no_one(leaderboard, settings):
    """Issue 41: where nothing measured a GPU node's device (on a node without CUDA the harness makes the child's
    out-of-memory error a plain fail), an out-of-memory error is the harness's "oom-unknown" result:
    retried once (not up to RUN_MAX_ATTEMPTS), then the run ends in ERROR: never the competitor's fail, never a
    problem error."""
    from runners.harness.device import Blame

    settings.RUN_MAX_ATTEMPTS = 5
    run = submission(leaderboard, mode="test").runs.get()
    said = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    for expected in (RunStatus.QUEUED, RunStatus.ERROR):
        result = Result(mode="test", protocol="kernelbot").out_of_memory(
            Blame("unknown", "nothing could measure the device's memory"), said)
        assert lifecycle.do_ingest_result(run.pk, dispatch(run), json.loads(json.dumps(result.as_dict())))
        run.refresh_from_db()
        assert (run.status, run.problem_error, run.passed) == (expected, False, None)
    assert run.infra_failures == 2 and run.error.startswith("the device ran out of memory and whose fault it was is "
                                                            "unknown: nothing could measure")
    assert not Problem.objects.get(pk=leaderboard.problem_id).broken_since
