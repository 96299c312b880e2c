from datetime import timedelta

import pytest
from django.utils import timezone

from leaderboards.actions import SubmissionRejected, check_submission, do_submit
from leaderboards.models import Code, Run, RunStatus, Submission, Visibility

from ..factories import UserFactory

GOOD = b"import torch\n\ndef custom_kernel(data):\n    a, b = data\n    return a + b\n"


def submit(leaderboard, content=GOOD, gpus=("CPU",), mode="leaderboard", user=None, name="add.py"):
    user = user or UserFactory()
    return user, check_submission(user, leaderboard.name, list(gpus), mode, name, content)


@pytest.mark.django_db
def test_leaderboard_submission_creates_public_and_secret_runs_and_enqueues_after_commit(
        leaderboard, django_capture_on_commit_callbacks):
    user, request = submit(leaderboard, gpus=["cpu"])  # GPU names match case-insensitively
    with django_capture_on_commit_callbacks() as callbacks:
        submission = do_submit(user, request)
    runs = list(submission.runs.order_by("secret"))
    assert [(r.secret, r.status) for r in runs] == [(False, RunStatus.QUEUED), (True, RunStatus.QUEUED)]
    assert all(r.status_deadline > timezone.now() for r in runs)
    assert submission.problem == leaderboard.problem
    assert user.profile.display_name == user.username
    assert len(callbacks) == 2  # one dispatch per run, only once the transaction commits


@pytest.mark.django_db
def test_test_mode_has_one_public_run_and_code_is_deduplicated(leaderboard):
    user, request = submit(leaderboard, mode="test")
    first = do_submit(user, request)
    second = do_submit(user, request)
    assert first.runs.count() == 1 and not first.runs.get().secret
    assert first.code_id == second.code_id and Code.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(("kwargs", "status", "fragment"), [
    ({"content": b""}, 400, "is empty"),
    ({"content": b"x" * (1024 * 1024 + 1)}, 413, "limit is 1048576 bytes"),
    ({"content": b"def custom_kernel(d):\n    return '\xff'\n"}, 400, "not UTF-8"),
    ({"content": b"a\x00b"}, 400, "NUL"),
    ({"gpus": ["H100"]}, 400, "does not run on GPU 'H100'; available: CPU"),
    ({"gpus": []}, 400, "Choose a GPU type"),
    ({"mode": "fastest"}, 400, "Unknown mode 'fastest'"),
])
def test_bad_submissions_are_rejected_precisely_and_write_nothing(leaderboard, kwargs, status, fragment):
    with pytest.raises(SubmissionRejected) as info:
        submit(leaderboard, **kwargs)
    assert info.value.status == status
    assert fragment in info.value.message
    assert Submission.objects.count() == 0 and Run.objects.count() == 0


@pytest.mark.django_db
def test_past_deadline_and_unknown_or_closed_leaderboards(leaderboard):
    leaderboard.deadline = timezone.now() - timedelta(minutes=1)
    leaderboard.save()
    with pytest.raises(SubmissionRejected) as info:
        submit(leaderboard)
    assert info.value.status == 403 and "no longer accepts submissions" in info.value.message

    leaderboard.deadline = timezone.now() + timedelta(days=1)
    leaderboard.visibility = Visibility.CLOSED
    leaderboard.save()
    with pytest.raises(SubmissionRejected) as info:
        submit(leaderboard)
    assert info.value.status == 404
    staff = UserFactory(is_staff=True)
    assert submit(leaderboard, user=staff)[1].leaderboard == leaderboard

    with pytest.raises(SubmissionRejected) as info:
        check_submission(staff, "no-such-board", ["CPU"], "test", "a.py", GOOD)
    assert info.value.status == 404 and "Unknown leaderboard 'no-such-board'" in info.value.message


@pytest.mark.django_db
def test_gpu_without_an_enabled_pool_is_unavailable(leaderboard, cpu_pool):
    cpu_pool.enabled = False
    cpu_pool.save()
    with pytest.raises(SubmissionRejected) as info:
        submit(leaderboard)
    assert info.value.status == 503 and "GPU 'CPU' is unavailable: no runner currently serves it" in info.value.message


@pytest.mark.django_db
def test_upcoming_leaderboard_rejects_submissions_until_it_opens(leaderboard, client):
    leaderboard.starts_at = timezone.now() + timedelta(hours=2)
    leaderboard.save()
    with pytest.raises(SubmissionRejected) as info:
        submit(leaderboard)
    assert info.value.status == 403 and "does not accept submissions yet" in info.value.message
    assert Submission.objects.count() == 0
    page = client.get("/").content.decode()
    assert page.index("Upcoming") < page.index(leaderboard.name) < page.index("Past")
    leaderboard.starts_at = timezone.now() - timedelta(minutes=1)
    leaderboard.save()
    assert submit(leaderboard)[1].leaderboard == leaderboard


@pytest.mark.django_db(transaction=True)  # foreign keys are checked at commit, which a test transaction never reaches
def test_a_leaderboard_deleted_between_check_and_write_is_a_clear_conflict_and_writes_nothing(leaderboard):
    user, request = submit(leaderboard)
    leaderboard.delete()
    with pytest.raises(SubmissionRejected) as info:
        do_submit(user, request)
    assert info.value.status == 409 and "changed while your submission was being saved" in info.value.message
    assert Submission.objects.count() == 0 and Run.objects.count() == 0 and Code.objects.count() == 0


@pytest.mark.django_db
def test_the_new_runs_come_back_with_the_submission_for_the_queue_estimate(leaderboard, django_assert_num_queries,
                                                                          monkeypatch):
    from leaderboards import actions
    from leaderboards.access.actions import queue_estimate

    monkeypatch.setattr(actions, "_insert_in_one_statement", actions._insert_with_orm)  # the portable path
    user, request = submit(leaderboard)
    submission = do_submit(user, request)
    read_itself = queue_estimate(submission)  # reads the runs (and warms the cached ETA inputs)
    runs = submission.new_runs
    with django_assert_num_queries(1):  # only the count of runs ahead: the runs themselves are at hand
        estimate = queue_estimate(submission, runs)
    assert [r.secret for r in runs] == [False, True] and all(r.pk for r in runs)
    assert (estimate.position, estimate.queued_jobs, estimate.gpu) == (1, 2, "CPU")
    assert estimate == read_itself
