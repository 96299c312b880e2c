"""do_submit writes in one statement on PostgreSQL and through the ORM elsewhere: the rows must be the same."""

import threading
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from leaderboards import actions
from leaderboards.access import actions as access
from leaderboards.actions import SubmissionRequest, check_submission, do_submit
from leaderboards.models import Code, Run, Submission
from runners.models import GpuType

from ..factories import UserFactory

CODE = "import torch\n\ndef custom_kernel(data):\n    a, b = data\n    return a + b\n"


def request_for(leaderboard, code=CODE, mode="leaderboard", gpu_types=None):
    return SubmissionRequest(leaderboard, gpu_types or list(leaderboard.gpu_types.all()), mode, "add.py", code)


def columns(row, exclude=()) -> dict:
    return {f.attname: getattr(row, f.attname) for f in row._meta.concrete_fields if f.attname not in exclude}


def stored(submission: Submission) -> tuple[dict, list[dict]]:
    row = columns(Submission.objects.get(pk=submission.pk), exclude=["id"])
    runs = [columns(run, exclude=["id", "submission_id", "status_deadline", "queued_at",
                                    "first_queued_at"])
            for run in Run.objects.filter(submission=submission).order_by("gpu_type", "secret")]
    return row, runs


@pytest.mark.django_db
def test_one_statement_stores_exactly_what_the_orm_stores(postgres, leaderboard, monkeypatch):
    t4 = GpuType.objects.create(name="T4")
    user = UserFactory()
    request = request_for(leaderboard, gpu_types=[*leaderboard.gpu_types.all(), t4])
    fast = do_submit(user, request)
    monkeypatch.setattr(actions, "_insert_in_one_statement", actions._insert_with_orm)
    portable = do_submit(user, request)

    fast_row, fast_runs = stored(fast)
    portable_row, portable_runs = stored(portable)
    assert fast_row.pop("created") == fast.created and portable_row.pop("created") == portable.created
    assert fast_row == portable_row and fast_row["code_id"] == Code.objects.get().pk
    assert fast_runs == portable_runs and len(fast_runs) == 4  # 2 GPU types x public and secret
    # the returned instances are what was stored, so the API can answer without reading them back
    for run in fast.new_runs:
        assert columns(run) == columns(Run.objects.get(pk=run.pk))


@pytest.mark.django_db
def test_one_statement_brings_the_queue_position_and_needs_no_more_queries(postgres, leaderboard, settings,
                                                                          django_assert_num_queries):
    user = UserFactory()
    request = request_for(leaderboard)
    for _ in range(3):
        earlier = do_submit(user, request)
    access.queue_estimate(earlier, earlier.new_runs)  # warms the cached ETA inputs (devices, mean run time)

    def statements_of_a_submit() -> tuple[Submission, list[str]]:
        with CaptureQueriesContext(connection) as queries:
            submission = do_submit(user, request)
        # the savepoint is the test's transaction; outside one there is none
        return submission, [q["sql"] for q in queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))]

    # under a quota: the user's lock and the recount come first (issue 27: a burst cannot pass a quota twice), in
    # statements of their own, since a statement's snapshot predates the lock it takes; then the one insert
    _, statements = statements_of_a_submit()
    assert len(statements) == 3 and statements[0].startswith('UPDATE "auth_user"'), statements
    assert "COUNT(" in statements[1] and statements[2].lstrip().startswith("WITH new_code")
    settings.SUBMISSION_QUOTAS = {kind: (0, 3600) for kind in settings.SUBMISSION_QUOTAS}  # no quota, no lock
    submission, statements = statements_of_a_submit()
    assert len(statements) == 1, statements
    with django_assert_num_queries(0):
        estimate = access.queue_estimate(submission, submission.new_runs)
    assert (estimate.position, estimate.queued_jobs) == (9, 10)  # 4 earlier submissions x 2 runs, then its own two
    assert estimate == access.queue_estimate(submission)  # the same as counting afterwards


@pytest.mark.django_db(transaction=True)
def test_the_same_new_file_committed_by_another_transaction_mid_statement_still_lands(postgres, leaderboard):
    """The statement's snapshot predates the other transaction's commit, so its first try sees no code row."""
    user = UserFactory()
    request = request_for(leaderboard, mode="test")
    other = connection.get_new_connection(connection.get_connection_params())  # a second session, no autocommit
    other.autocommit = False
    other.execute(f"INSERT INTO {Code._meta.db_table} (sha256, text) VALUES (%s, %s)",
                  (Code.digest(CODE), CODE))
    outcome: dict = {}

    def submit_now():
        try:
            outcome["submission"] = do_submit(user, request)
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            outcome["error"] = exc
        finally:
            connection.close()

    worker = threading.Thread(target=submit_now)
    waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%new_code%'"
    try:
        worker.start()
        for _ in range(500):
            with connection.cursor() as cursor:  # autocommit: a fresh view of pg_stat_activity each time
                cursor.execute(waiting)
                if cursor.fetchone()[0]:
                    break
            time.sleep(0.02)
        else:
            pytest.fail("the submission never waited for the other transaction's code row")
        other.commit()
        worker.join(10)
    finally:
        other.close()
    assert "error" not in outcome, outcome.get("error")
    submission = Submission.objects.get(pk=outcome["submission"].pk)
    assert submission.code == Code.objects.get(sha256=Code.digest(CODE)) and Code.objects.count() == 1
    assert submission.runs.count() == 1


@pytest.mark.django_db
def test_board_edits_reach_the_next_submission_at_once(leaderboard):
    user = UserFactory()
    check_submission(user, leaderboard.name, ["CPU"], "test", "a.py", CODE.encode())  # now cached
    leaderboard.gpu_types.clear()
    with pytest.raises(actions.SubmissionRejected, match="does not run on GPU 'CPU'"):
        check_submission(user, leaderboard.name, ["CPU"], "test", "a.py", CODE.encode())
    leaderboard.gpu_types.add(GpuType.objects.get(name="CPU"))
    check_submission(user, leaderboard.name, ["CPU"], "test", "a.py", CODE.encode())
    leaderboard.deadline = leaderboard.created
    leaderboard.save()
    with pytest.raises(actions.SubmissionRejected, match="no longer accepts submissions"):
        check_submission(user, leaderboard.name, ["CPU"], "test", "a.py", CODE.encode())
