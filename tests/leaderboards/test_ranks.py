"""A ranked result changes its board by what it changes: the entry it moves, the ranks it passes, the records."""

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from leaderboards import actions, events, ranks
from leaderboards.history import board_history
from leaderboards.models import Board, BoardEntry, Record
from leaderboards.ranking import rank

from ..factories import UserFactory, ranked_result, submission
from .test_lifecycle import dispatch, finish

pytestmark = pytest.mark.django_db
START = datetime(2026, 1, 1, tzinfo=UTC)


def result_on(sub, means) -> int:
    """Both runs pass with `means`; returns the secret run's id (the one whose result completes the pair)."""
    finish(sub, means)
    return sub.runs.get(secret=True).pk


def test_a_result_moves_one_entry_and_shifts_the_ranks_it_passes(leaderboard, cpu_pool, monkeypatch,
                                                                 django_capture_on_commit_callbacks):
    users = [UserFactory() for _ in range(4)]
    for i, user in enumerate(users):
        ranks.do_rank_result(result_on(submission(leaderboard, user, code=str(i)), [1000.0 * (i + 1)]))
    sent = []
    monkeypatch.setattr(events, "board_changed", lambda *args, **parts: sent.append((*args, parts)))
    board = Board.objects.get(leaderboard=leaderboard)
    faster = result_on(submission(leaderboard, users[3], code="faster"), [1500.0])  # 4th → 2nd
    with django_capture_on_commit_callbacks(execute=True), CaptureQueriesContext(connection) as queries:
        assert ranks.do_rank_result(faster)
    run_reads = [q["sql"] for q in queries.captured_queries if re.search(r'FROM "?leaderboards_run\b', q["sql"])]
    assert run_reads and all(re.search(r'(\br|"leaderboards_run")\."?(submission_id|id)"? = ', sql)
                             for sql in run_reads)  # the result's own runs, never the board's
    entries = BoardEntry.objects.for_board(leaderboard, cpu_pool.cpu).page(0, 10)
    assert [(e.user, e.rank) for e in entries] == [(users[0], 1), (users[3], 2), (users[1], 3), (users[2], 4)]
    entry_writes = [q["sql"] for q in queries.captured_queries
                    if re.match(r'(UPDATE|INSERT INTO) "?leaderboards_boardentry\b', q["sql"])]
    assert len(entry_writes) == 1 and "rank" not in entry_writes[0].split(" WHERE ")[0].replace("rank_key", "")
    (_, _, version, delta, removed, shift, parts), = sent
    assert version == board.version + 1 and removed == []
    assert parts == {"entrants": False, "records": False, "record_added": None, "gpu_name": "CPU",
                     "on_ratio": False}  # a move
    assert [(e["user"], e["rank"]) for e in delta] == [(users[3].pk, 2)]
    assert shift == [2, 4, 1]  # the other rows ranked 2..4 (the mover held 4) move down one
    with django_capture_on_commit_callbacks(execute=True):
        assert not ranks.do_rank_result(faster)  # idempotent: no change, no event
    assert len(sent) == 1 and not ranks.do_recompute_ranks(leaderboard.pk, cpu_pool.cpu.pk)


def test_records_stay_right_when_results_arrive_out_of_submission_order(leaderboard, cpu_pool):
    alice, bob = UserFactory(), UserFactory()
    late = submission(leaderboard, alice, code="late", created=START + timedelta(minutes=5))
    early = submission(leaderboard, bob, code="early", created=START)
    ranks.do_rank_result(result_on(late, [2000.0]))
    assert list(Record.objects.values_list("user", "board_best")) == [(alice.pk, True)]
    ranks.do_rank_result(result_on(early, [1000.0]))  # submitted first, faster: alice's 2 µs was never a record
    assert sorted(Record.objects.values_list("user", "board_best")) == sorted([(alice.pk, False), (bob.pk, True)])
    assert not ranks.do_recompute_ranks(leaderboard.pk, cpu_pool.cpu.pk)
    assert sorted(Record.objects.values_list("user", "board_best")) == sorted([(alice.pk, False), (bob.pk, True)])


def test_a_record_in_its_time_that_does_not_beat_the_entry_still_updates_the_chart(
        leaderboard, cpu_pool, monkeypatch, django_capture_on_commit_callbacks):
    alice = UserFactory()
    slow = submission(leaderboard, alice, code="slow", created=START)
    fast = submission(leaderboard, alice, code="fast", created=START + timedelta(minutes=5))
    ranks.do_rank_result(result_on(fast, [1000.0]))
    sent = []
    monkeypatch.setattr(events, "board_changed", lambda *args, **parts: sent.append((*args, parts)))
    with django_capture_on_commit_callbacks(execute=True):
        assert ranks.do_rank_result(result_on(slow, [2000.0]))  # the board's first record, submitted first
    assert sorted(Record.objects.values_list("submission_id", "board_best")) == [(slow.pk, True), (fast.pk, True)]
    (_, _, _, delta, removed, shift, parts), = sent
    assert (delta, removed, shift, parts) == ([], [], None, {"entrants": False, "records": True, "record_added": None,
                                                 "gpu_name": "CPU", "on_ratio": False})
    assert BoardEntry.objects.get().submission == fast and not ranks.do_recompute_ranks(leaderboard.pk,
                                                                                        cpu_pool.cpu.pk)


def with_ratio(sub, time_ns, ratio) -> int:
    """Both runs pass with a time and a ratio; returns the secret run's id."""
    for run in sub.runs.all():
        result = ranked_result([time_ns])
        result["ranked"][-1].update(time=time_ns, ratio=ratio, ratio_low=ratio * .9, ratio_high=ratio * 1.1)
        actions.do_ingest_result(run.pk, dispatch(run), result)
    return sub.runs.get(secret=True).pk


def test_a_result_without_a_ratio_switches_a_ratio_board_to_time(leaderboard, cpu_pool):
    fast_ratio, fast_time = UserFactory(), UserFactory()
    ranks.do_rank_result(with_ratio(submission(leaderboard, fast_ratio, code="a"), 3000.0, 0.5))
    ranks.do_rank_result(with_ratio(submission(leaderboard, fast_time, code="b"), 1000.0, 0.9))
    assert [e.user for e in BoardEntry.objects.for_board(leaderboard, cpu_pool.cpu)] == [fast_ratio, fast_time]
    ranks.do_rank_result(result_on(submission(leaderboard, UserFactory(), code="c"), [2000.0]))  # no ratio
    assert not Board.objects.get(leaderboard=leaderboard).ranks_on_ratio
    assert [e.rank_key for e in BoardEntry.objects.for_board(leaderboard, cpu_pool.cpu)] == [1e-6, 2e-6, 3e-6]


@pytest.mark.parametrize("goes", ["deleted", "requeued"])
def test_when_the_last_result_without_a_ratio_goes_the_board_ranks_on_the_ratio_again(
        goes, leaderboard, cpu_pool, sync_queue, monkeypatch, django_capture_on_commit_callbacks):
    monkeypatch.setattr("leaderboards.tasks.dispatch_run", lambda run_id: None)  # keep a requeued run queued
    fast_ratio, fast_time = UserFactory(), UserFactory()
    ranks.do_rank_result(with_ratio(submission(leaderboard, fast_ratio, code="a", created=START), 3000.0, 0.5))
    ranks.do_rank_result(with_ratio(submission(leaderboard, fast_time, code="b", created=START), 1000.0, 0.9))
    # a later, slower one without a ratio: neither an entry nor a record, yet the board ranks on time for it
    slower = submission(leaderboard, fast_time, code="c", created=START + timedelta(minutes=5))
    ranks.do_rank_result(result_on(slower, [2000.0]))
    on_time = BoardEntry.objects.for_board(leaderboard, cpu_pool.cpu)
    assert not Board.objects.get(leaderboard=leaderboard).ranks_on_ratio
    assert [e.user for e in on_time] == [fast_time, fast_ratio] and not Record.objects.filter(submission=slower)
    with django_capture_on_commit_callbacks(execute=True):
        if goes == "deleted":
            actions.do_delete_submission(slower)
        else:
            actions.do_requeue_run(slower.runs.get(secret=True))
    assert Board.objects.get(leaderboard=leaderboard).ranks_on_ratio
    assert [(e.user, e.rank_key) for e in on_time.all()] == [(fast_ratio, 0.5), (fast_time, 0.9)]


def test_a_deletion_that_changes_only_the_records_tells_clients(leaderboard, cpu_pool, monkeypatch,
                                                                django_capture_on_commit_callbacks, sync_queue):
    alice, bob = UserFactory(), UserFactory()
    first = submission(leaderboard, alice, code="first", created=START)  # a record, not alice's entry
    ranks.do_rank_result(result_on(first, [3000.0]))
    ranks.do_rank_result(result_on(submission(leaderboard, bob, code="b", created=START + timedelta(minutes=1)),
                                   [2000.0]))
    ranks.do_rank_result(result_on(submission(leaderboard, alice, code="best", created=START + timedelta(minutes=2)),
                                   [1000.0]))
    entries = list(BoardEntry.objects.values_list("user", "submission"))
    sent = []
    monkeypatch.setattr(events, "board_changed", lambda *args, **parts: sent.append((*args, parts)))
    with django_capture_on_commit_callbacks(execute=True):
        actions.do_delete_submission(first)
    assert list(BoardEntry.objects.values_list("user", "submission")) == entries  # the ranking did not change
    assert [(row[-1]["entrants"], row[-1]["records"]) for row in sent] == [(False, True)]  # the chart did
    assert [holder for _, _, holder in board_history(leaderboard.pk, cpu_pool.cpu.pk, [])["records"]] == [
        bob.pk, alice.pk]


@pytest.mark.parametrize("results", [
    # equal keys share a rank; the one still at the mover's old key moves down with the others it passed
    [(0, 1000, None), (1, 2000, None), (2, 2000, None), (2, 500, None)],
    # the follower the mover leaves behind is no longer tied: the entry now above it is told apart from it
    [(0, 1000, (0.5, 0.49, 0.51)), (1, 1000, (0.6, 0.55, 0.65)), (2, 1000, (0.62, 0.6, 0.64)),
     (1, 1000, (0.3, 0.29, 0.31))],
], ids=["equal-keys", "old-follower-tie"])
def test_incremental_moves_match_the_rebuild(leaderboard, cpu_pool, results):
    users = [UserFactory() for _ in range(3)]
    for i, (user, time_ns, ratio) in enumerate(results):
        sub = submission(leaderboard, users[user], code=str(i))
        for run in sub.runs.all():
            result = ranked_result([time_ns])
            if ratio:
                result["ranked"][-1].update(time=time_ns, ratio=ratio[0], ratio_low=ratio[1], ratio_high=ratio[2])
            actions.do_ingest_result(run.pk, dispatch(run), result)
        ranks.do_rank_result(sub.runs.get(secret=True).pk)
    kept = list(BoardEntry.objects.for_board(leaderboard, cpu_pool.cpu).with_rank().values_list("user", "rank", "tied"))
    assert not ranks.do_recompute_ranks(leaderboard.pk, cpu_pool.cpu.pk), kept


def test_a_requeued_run_given_to_the_hook_takes_its_submission_off_the_board(leaderboard, cpu_pool, monkeypatch):
    monkeypatch.setattr("leaderboards.actions.enqueue_on_commit", lambda *args, **kwargs: None)
    sub = submission(leaderboard)
    ranks.do_rank_result(result_on(sub, [1000.0]))
    run = sub.runs.get(secret=True)
    actions.do_requeue_run(run)
    assert ranks.do_rank_result(run.pk)  # as main's on_finish hook calls it on a requeue
    assert not BoardEntry.objects.exists() and not Record.objects.exists()


def test_pages_rank_their_rows_as_the_whole_board_does(leaderboard, cpu_pool):
    """Ranks are read, not stored: every window of the board (a page that starts inside a run of equal keys
    included) numbers its rows as `ranking.rank` numbers the whole board, and so does the per-entry count."""
    times = [1000.0, 1000.0, 1500.0, 2000.0, 2000.0, 2000.0, 2500.0, 3000.0, 3000.0]
    for i, time_ns in enumerate(times):
        ranks.do_rank_result(result_on(submission(leaderboard, UserFactory(), code=str(i)), [time_ns]))
    expected = [(r.user_id, r.rank) for r in rank(ranks.ranked_candidates(leaderboard.pk, cpu_pool.cpu.pk))]
    assert [r for _, r in expected] == [1, 1, 3, 4, 4, 4, 7, 8, 8]
    entries = BoardEntry.objects.for_board(leaderboard, cpu_pool.cpu)
    assert [(e.user_id, e.rank) for e in entries.with_rank()] == expected
    for start in range(len(times)):
        for stop in range(start + 1, len(times) + 2):
            with CaptureQueriesContext(connection) as queries:
                rows = entries.page(start, stop)
            assert [(e.user_id, e.rank) for e in rows] == expected[start:stop], (start, stop)
            assert len(queries) == (2 if start else 1)  # the rows, and the count ahead of a page not at the top
    leader, = BoardEntry.objects.leaders()
    assert (leader.user_id, leader.rank_key) == (expected[0][0], 1e-6)


def test_a_deleted_user_leaves_the_boards_and_later_records_move_up(leaderboard, cpu_pool, monkeypatch, sync_queue,
                                                                    django_capture_on_commit_callbacks):
    alice, bob, carol = UserFactory(), UserFactory(), UserFactory()
    for i, (user, means) in enumerate(((alice, [1000.0]), (bob, [2000.0]), (carol, [3000.0]))):
        ranks.do_rank_result(result_on(submission(leaderboard, user, code=str(i), created=START + timedelta(
            minutes=i)), means))
    holders = lambda: [h for _, _, h in board_history(leaderboard.pk, cpu_pool.cpu.pk, [])["records"]]  # noqa: E731
    assert holders() == [alice.pk]  # alice's first, faster result kept bob's from being a record
    sent, alice_id = [], alice.pk
    monkeypatch.setattr(events, "board_changed", lambda *args, **parts: sent.append((*args, parts)))
    with django_capture_on_commit_callbacks(execute=True):
        alice.delete()  # an organiser removes an account (admin): its submissions go by cascade
    entries = BoardEntry.objects.for_board(leaderboard, cpu_pool.cpu).page(0, 10)
    assert [(e.user, e.rank) for e in entries] == [(bob, 1), (carol, 2)]
    (_, _, _, _, removed, shift, _) = sent[0]
    assert removed == [alice_id] and shift == [2, None, -1]  # clients drop her row and move the others up
    assert holders() == [bob.pk] and sent[-1][-1]["records"]  # bob's result is the board's record now
    assert not ranks.do_recompute_ranks(leaderboard.pk, cpu_pool.cpu.pk)
