"""The run state machine, result ingestion, retries, the reaper and materialised ranks."""

import itertools
from datetime import timedelta

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from kernelbot import redis_clients
from leaderboards import actions, lifecycle, tasks
from leaderboards.models import Board, BoardEntry, InvalidTransition, Run, RunAttempt, RunStatus
from runners import queue
from runners.models import GpuPool, RunnerBackendName

from ..factories import UserFactory, ranked_result, remote_pool, submission

pytestmark = pytest.mark.django_db


def dispatch(run: Run) -> int:
    run.refresh_from_db()
    run.update_status(RunStatus.DISPATCHED, attempt=run.attempt + 1)
    return run.attempt


def finish(sub, means_public, means_secret=None, verdict="pass"):
    for run in sub.runs.all():
        attempt = dispatch(run)
        means = means_secret if run.secret and means_secret is not None else means_public
        assert lifecycle.do_ingest_result(run.pk, attempt, ranked_result(means, verdict))


def test_transitions_are_enforced(leaderboard):
    run = submission(leaderboard).runs.first()
    with pytest.raises(InvalidTransition):
        run.update_status(RunStatus.RUNNING)
    attempt = dispatch(run)
    assert lifecycle.do_mark_running(run.pk, attempt)
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.started_at and run.dispatched_at and run.attempt == 1


def test_ingest_scores_a_pass_and_ignores_stale_or_repeated_reports(leaderboard):
    run = submission(leaderboard).runs.get(secret=False)
    attempt = dispatch(run)
    assert not lifecycle.do_ingest_result(run.pk, attempt - 1, ranked_result([5000.0]))  # stale attempt
    assert lifecycle.do_ingest_result(run.pk, attempt, ranked_result([1000.0, 3000.0]))
    assert not lifecycle.do_ingest_result(run.pk, attempt, ranked_result([1.0]))  # repeated: counted once
    run.refresh_from_db()
    assert (run.status, run.passed, run.verdict) == (RunStatus.SUCCEEDED, True, "pass")
    assert run.score == pytest.approx(3e-6)  # ranking_by=last
    assert run.finished_at and run.status_deadline is None


@pytest.mark.parametrize(("verdict", "status"), [("fail", RunStatus.FAILED), ("crash", RunStatus.FAILED),
                                                  ("timeout", RunStatus.TIMED_OUT), ("hacked", RunStatus.HACKED),
                                                  ("compile_error", RunStatus.FAILED)])
def test_failing_verdicts_map_to_terminal_statuses_without_score(leaderboard, verdict, status):
    run = submission(leaderboard).runs.get(secret=False)
    lifecycle.do_ingest_result(run.pk, dispatch(run), ranked_result([1000.0], verdict))
    run.refresh_from_db()
    assert (run.status, run.passed, run.score) == (status, False, None)
    assert run.error


def test_infrastructure_failures_retry_then_fail_with_reason(leaderboard, settings):
    settings.RUN_MAX_ATTEMPTS = 2
    run = submission(leaderboard).runs.get(secret=False)
    assert lifecycle.do_ingest_result(run.pk, dispatch(run), {"status": "error", "error": "node lost"})
    run.refresh_from_db()
    assert (run.status, run.infra_failures, run.error) == (RunStatus.QUEUED, 1, lifecycle.INFRA_RETRYING)
    assert lifecycle.do_report_failure(run.pk, dispatch(run), "disk full in /srv/kernelbot/runs")
    run.refresh_from_db()
    assert run.status == RunStatus.ERROR and run.error == lifecycle.INFRA_GAVE_UP.format(failures=2)
    # what broke is the organisers' (the attempts, Admin → Runs), never in what the competitor reads
    assert list(run.attempts.values_list("reason", flat=True)) == ["node lost", "disk full in /srv/kernelbot/runs"]


def test_reaper_retries_overdue_runs_in_every_active_state(leaderboard, settings):
    settings.RUN_MAX_ATTEMPTS = 5
    sub = submission(leaderboard)
    queued, running = sub.runs.order_by("secret")
    lifecycle.do_mark_running(running.pk, dispatch(running))
    later = timezone.now() + timedelta(hours=3)
    assert lifecycle.do_reap_overdue_runs(now=timezone.now()) == 0  # nothing overdue yet
    assert lifecycle.do_reap_overdue_runs(now=later) == 2
    queued.refresh_from_db()
    running.refresh_from_db()
    # its message may be lost: the reaper dispatched it itself (no second message), and waiting isn't charged
    assert (queued.status, queued.attempt, queued.infra_failures) == (RunStatus.DISPATCHED, 1, 0)
    assert running.status == RunStatus.QUEUED and running.infra_failures == 1
    assert not lifecycle.do_ingest_result(running.pk, running.attempt, ranked_result([1.0]))  # lost worker's report
    assert lifecycle.do_reap_overdue_runs(now=timezone.now() + timedelta(days=2)) == 2
    queued.refresh_from_db()
    running.refresh_from_db()
    assert running.status == RunStatus.ERROR and "within 24 h" in running.error
    # dispatched to a local pool no live agent serves: a failed attempt, retried (elsewhere when there is elsewhere)
    assert queued.status == RunStatus.QUEUED and queued.infra_failures == 1


def test_a_run_whose_message_was_lost_is_dispatched_within_seconds_and_once(
        leaderboard, settings, monkeypatch, dead_redis_url, django_capture_on_commit_callbacks):
    """The broker away when a run is queued (issue 35): its message is never sent, and busy workers would go on with
    later runs. The reaper (every 2 s under `manage.py workers`) dispatches it itself once it has waited
    KERNELBOT_QUEUED_RESEND seconds; a message that does arrive later changes nothing."""
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "redis": dead_redis_url}
    broker = redis_clients.Broker()
    monkeypatch.setattr(queue, "broker", lambda: broker)
    # as a run for a remote pool (Slurm, GitHub, Modal): handed to the workers, not dispatched by the submission
    monkeypatch.setattr(lifecycle, "dispatch_here", lambda run_id: lifecycle.enqueue(lifecycle.DISPATCH_TASK, run_id))
    user = UserFactory()
    with django_capture_on_commit_callbacks(execute=True):
        sub = actions.do_submit(user, actions.check_submission(user, leaderboard.name, ["CPU"], "test", "k.py",
                                                               b"def custom_kernel(data): ..."))
    (run,) = sub.runs.all()
    assert run.status == RunStatus.QUEUED
    assert timedelta(seconds=5) <= run.status_deadline - run.queued_at < timedelta(seconds=6)  # KERNELBOT_QUEUED_RESEND
    assert lifecycle.do_reap_overdue_runs(now=run.queued_at + timedelta(seconds=4)) == 0
    assert lifecycle.do_reap_overdue_runs(now=run.queued_at + timedelta(seconds=7)) == 1
    run.refresh_from_db()
    assert (run.status, run.attempt, run.infra_failures) == (RunStatus.DISPATCHED, 1, 0)
    tasks.dispatch_run(run.pk)  # the message, had it been sent after all
    run.refresh_from_db()
    assert (run.status, run.attempt, run.attempts.count()) == (RunStatus.DISPATCHED, 1, 1)


def test_a_run_for_node_agents_is_dispatched_by_its_submission_and_one_for_a_remote_pool_goes_to_the_workers(
        leaderboard, monkeypatch, dead_redis_url, settings, django_capture_on_commit_callbacks):
    """Issue 50: a burst's runs waited seconds in the queue before a worker handed each to the node agents' pool (a
    few queries and a wake-up). The submitting process does that itself now, the broker away or not; a run whose
    pool is remote, or one the submitting process could not hand over, is still sent to the workers."""
    sent = []
    monkeypatch.setattr(lifecycle, "enqueue", lambda func, run_id: sent.append((func, run_id)) or True)
    user = UserFactory()

    def submit_one():
        with django_capture_on_commit_callbacks(execute=True):
            sub = actions.do_submit(user, actions.check_submission(user, leaderboard.name, ["CPU"], "test", "k.py",
                                                                   b"def custom_kernel(data): ..."))
        return sub.runs.get()
    run = submit_one()
    assert (run.status, run.attempt, sent) == (RunStatus.DISPATCHED, 1, [])
    remote = GpuPool(name="far", backend=RunnerBackendName.SLURM)
    monkeypatch.setattr(lifecycle, "candidate_pools", lambda run: [remote])
    run = submit_one()
    assert (run.status, run.attempt, sent) == (RunStatus.QUEUED, 0, [(lifecycle.DISPATCH_TASK, run.pk)])

    def broken(run):
        raise OperationalError("the connection was lost")
    monkeypatch.setattr(lifecycle, "candidate_pools", broken)
    run = submit_one()
    assert (run.status, sent[-1]) == (RunStatus.QUEUED, (lifecycle.DISPATCH_TASK, run.pk))


def test_the_supervisors_evidence_of_a_wedge_counts_only_runs_the_workers_were_sent(leaderboard, cpu_pool,
                                                                                     monkeypatch):
    """A node agents' run dispatched by its submission sent the cluster no message: a stream of those while no task
    is due is not a wedge (the supervisor restarted a healthy cluster mid-burst for them). A run still queued, or a
    remote pool's, was the workers' to dispatch."""
    monkeypatch.setattr(lifecycle, "enqueue", lambda func, run_id: True)
    since = timezone.now() - timedelta(seconds=1)
    here = submission(leaderboard, mode="test").runs.get()
    lifecycle.dispatch_here(here.pk)
    assert Run.objects.get(pk=here.pk).status == RunStatus.DISPATCHED
    window = {"queued_after": since, "queued_before": timezone.now() + timedelta(seconds=1)}
    assert lifecycle.count_queued_runs(**window) == 0
    submission(leaderboard, mode="test")  # still queued: its message may sit in a wedged cluster
    assert lifecycle.count_queued_runs(**window) == 1
    far = submission(leaderboard, mode="test").runs.get()
    Run.objects.filter(pk=far.pk).update(status=RunStatus.DISPATCHED, attempt=1)
    RunAttempt.objects.create(run=far, number=1, dispatched_at=timezone.now(), pool=remote_pool(
        RunnerBackendName.SLURM, cpu_pool.cpu))
    assert lifecycle.count_queued_runs(**window) == 2


def test_a_run_left_queued_by_its_dispatch_is_looked_at_again_after_the_long_deadline(leaderboard, monkeypatch):
    """Every pool of its type failing its health check: the reaper's dispatch leaves it queued, and the next look is
    KERNELBOT_QUEUED_DEADLINE (300 s) later, not every few seconds."""
    monkeypatch.setattr(lifecycle, "candidate_pools", lambda run: [])
    run = submission(leaderboard, mode="test").runs.get()
    now = timezone.now() + timedelta(seconds=6)
    assert lifecycle.do_reap_overdue_runs(now=now) == 1
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.status_deadline > now + timedelta(seconds=250)
    assert lifecycle.do_reap_overdue_runs(now=now + timedelta(seconds=10)) == 0


def test_ranks_need_public_and_secret_pass_and_use_the_slower(leaderboard, cpu_pool):
    alice, bob, carol = UserFactory(), UserFactory(), UserFactory()
    finish(submission(leaderboard, alice, code="a"), [1000.0], [1200.0])
    finish(submission(leaderboard, bob, code="b"), [900.0], [1100.0])
    finish(submission(leaderboard, carol, code="c"), [500.0], [500.0], verdict="pass")
    carol_secret_fail = submission(leaderboard, carol, code="c2")
    public, secret = carol_secret_fail.runs.order_by("secret")
    lifecycle.do_ingest_result(public.pk, dispatch(public), ranked_result([100.0]))
    lifecycle.do_ingest_result(secret.pk, dispatch(secret), ranked_result([100.0], "fail"))

    assert actions.do_recompute_ranks(leaderboard.pk, cpu_pool.cpu.pk)
    entries = BoardEntry.objects.for_board(leaderboard, cpu_pool.cpu).page(0, 50)
    assert [(e.user, e.rank, round(e.score * 1e9)) for e in entries] == [(carol, 1, 500), (bob, 2, 1100),
                                                                          (alice, 3, 1200)]
    board = Board.objects.get(leaderboard=leaderboard, gpu_type=cpu_pool.cpu)
    assert board.version == 1
    assert not actions.do_recompute_ranks(leaderboard.pk, cpu_pool.cpu.pk)  # idempotent: no change, no event
    assert Board.objects.get(pk=board.pk).version == 1


def test_rank_reads_are_one_query(leaderboard, cpu_pool):
    for i in range(5):
        finish(submission(leaderboard, code=str(i)), [1000.0 + i])
    actions.do_recompute_ranks(leaderboard.pk, cpu_pool.cpu.pk)
    with CaptureQueriesContext(connection) as queries:
        rows = BoardEntry.objects.for_board(leaderboard, cpu_pool.cpu).select_related("user").page(0, 50)
    assert [e.rank for e in rows] == [1, 2, 3, 4, 5] and len(queries) == 1


def test_requeue_and_cancel_update_ranks(leaderboard, cpu_pool, django_capture_on_commit_callbacks, sync_queue,
                                         monkeypatch):
    monkeypatch.setattr("leaderboards.tasks.dispatch_run", lambda run_id: None)  # keep the requeued run queued
    sub = submission(leaderboard)
    finish(sub, [1000.0])
    actions.do_recompute_ranks(leaderboard.pk, cpu_pool.cpu.pk)
    assert BoardEntry.objects.count() == 1
    with django_capture_on_commit_callbacks(execute=True):
        lifecycle.do_requeue_run(sub.runs.get(secret=True))
    assert BoardEntry.objects.count() == 0  # no longer both passed
    run = sub.runs.get(secret=True)
    assert run.status == RunStatus.QUEUED and run.score is None
    assert lifecycle.do_cancel_run(run)
    assert not lifecycle.do_cancel_run(run)  # already terminal
    assert Run.objects.get(pk=run.pk).status == RunStatus.CANCELLED


def test_rescore_applies_a_new_ranking_rule(leaderboard, cpu_pool):
    finish(submission(leaderboard), [1000.0, 4000.0])
    actions.do_recompute_ranks(leaderboard.pk, cpu_pool.cpu.pk)
    assert BoardEntry.objects.get().score == pytest.approx(4e-6)
    leaderboard.ranking_by = "geom"
    leaderboard.save()
    assert actions.do_rescore_leaderboard(leaderboard) == 2
    actions.do_recompute_ranks(leaderboard.pk, cpu_pool.cpu.pk)
    assert BoardEntry.objects.get().score == pytest.approx(2e-6)


def ratio_result(time_ns: float, ratio: float, low: float, high: float | None) -> dict:
    result = ranked_result([time_ns * 1.5])  # the mean, skewed by a loaded host: the median `time` is scored
    result["ranked"][-1].update(time=time_ns, ratio=ratio, ratio_low=low, ratio_high=high, reference=1000.0)
    return result


def test_ratio_ranks_the_board_and_marks_statistical_ties(leaderboard, cpu_pool):
    """The ratio to the reference decides the order even when the times say otherwise (a host that was busy
    during one run), and entries the intervals cannot separate are marked tied."""
    users = UserFactory(), UserFactory(), UserFactory()
    results = [ratio_result(3000.0, 0.50, 0.48, 0.52),  # slower time (busy host), best ratio
               ratio_result(1000.0, 0.80, 0.77, 0.83),
               ratio_result(1100.0, 0.82, 0.78, None)]  # no upper bound: tied with anything above
    for user, result in zip(users, results, strict=True):
        for run in submission(leaderboard, user, code=str(user.pk)).runs.all():
            assert lifecycle.do_ingest_result(run.pk, dispatch(run), result)
    run = Run.objects.filter(submission__user=users[0]).first()
    assert (run.score, run.ratio, run.ratio_low, run.ratio_high) == pytest.approx((3e-6, 0.50, 0.48, 0.52))

    assert actions.do_recompute_ranks(leaderboard.pk, cpu_pool.cpu.pk)
    entries = BoardEntry.objects.for_board(leaderboard, cpu_pool.cpu).page(0, 50)
    assert [(e.user, e.rank, e.ratio, e.tied) for e in entries] == [
        (users[0], 1, 0.50, False), (users[1], 2, 0.80, False), (users[2], 3, 0.82, True)]
    assert entries[2].ratio_high is None and entries[0].score == pytest.approx(3e-6)


@pytest.mark.django_db(transaction=True)
def test_a_result_waits_for_its_run_only_not_its_leaderboard_or_gpu_type(postgres, leaderboard, cpu_pool):
    """Another session holding the leaderboard's and the GPU type's rows (an organiser's admin save, another result)
    does not hold up a result: the ingest locks the run's row alone."""
    run = submission(leaderboard).runs.get(secret=False)
    attempt = dispatch(run)
    other = connection.get_new_connection(connection.get_connection_params())
    other.autocommit = False
    try:
        other.execute(f"SELECT 1 FROM {leaderboard._meta.db_table} WHERE id = %s FOR UPDATE", [leaderboard.pk])
        other.execute(f"SELECT 1 FROM {cpu_pool.cpu._meta.db_table} WHERE id = %s FOR UPDATE", [cpu_pool.cpu.pk])
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '3s'")  # waiting on either row fails the ingest with a lock timeout
        assert lifecycle.do_ingest_result(run.pk, attempt, ranked_result([1000.0]))
    finally:
        other.rollback()
        other.close()
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED


def test_a_hook_that_keeps_failing_is_sent_again_less_and_less_often_and_never_dropped(leaderboard, monkeypatch,
                                                                                       settings):
    """A run's on_finish task that the broker takes but that never gets done (the hook raises, its worker is killed)
    is sent again after as long as it has been owed, from RUN_HOOK_RESEND up to an hour, not every 20 s for ever;
    one the broker does not take (away, hanging) is tried again RUN_HOOK_RESEND later, however long it is owed."""
    sent, broker_up = [], [True]
    monkeypatch.setattr(lifecycle, "enqueue", lambda func, run_id: sent.append(run_id) or broker_up[0])
    sub = submission(leaderboard)
    finish(sub, [1000.0])  # the hooks are owed: their on-commit sends never ran
    run = sub.runs.get(secret=False)
    now = run.hook_due

    def resend() -> float:
        nonlocal now
        now += timedelta(seconds=1)  # each try just after the run is due again
        lifecycle.do_resend_run_hooks(now)
        run.refresh_from_db()
        wait, now = (run.hook_due - now).total_seconds(), run.hook_due
        return wait
    waits = [resend() for _ in range(12)]
    assert sent.count(run.pk) == 12  # never dropped
    assert settings.RUN_HOOK_RESEND <= waits[0] < 2 * settings.RUN_HOOK_RESEND + 2
    assert all(later >= 2 * earlier or later == lifecycle.HOOK_RESEND_MAX
               for earlier, later in itertools.pairwise(waits))
    assert waits[-1] == lifecycle.HOOK_RESEND_MAX
    broker_up[0] = False
    assert [resend() for _ in range(3)] == [settings.RUN_HOOK_RESEND] * 3  # owed for hours, yet tried soon again
    assert sent.count(run.pk) == 15
