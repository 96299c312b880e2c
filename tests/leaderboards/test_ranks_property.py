"""Property: whatever happens to a board (results arriving in any order, public and secret runs apart, deletions,
requeues, bans, rescoring, deleted accounts), the board its hooks maintain (entries, ranks, ties, records) is the
one the full rebuild makes, and a client applying the live deltas to its rows holds the same ranks. Real
PostgreSQL."""

from datetime import UTC, datetime, timedelta

import pytest
from django.utils.module_loading import import_string
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leaderboards import actions, events
from leaderboards.access.actions import do_ban
from leaderboards.history import board_history
from leaderboards.models import BOARD_ORDER, Board, BoardEntry, Leaderboard, Record, Run, RunStatus
from leaderboards.ranking import rank
from leaderboards.ranks import ranked_candidates

from ..factories import UserFactory, ranked_result, submission
from .test_lifecycle import dispatch

pytestmark = pytest.mark.django_db

START = datetime(2026, 1, 1, tzinfo=UTC)
TIMES = [1000.0, 1200.0, 2000.0]  # ns; few values, so equal keys and shared ranks are common
RATIOS = [(0.5, 0.45, 0.55), (0.52, 0.51, 0.53), (0.8, 0.79, 0.81), (0.5, 0.3, None)]
USERS = 6

# an outcome: None (wrong answer, one in five) or two ranked cases' (time, ratio) indices; ratio None: none (popcorn)
passing = st.tuples(st.sampled_from(TIMES), st.sampled_from(TIMES),
                    st.sampled_from([*range(len(RATIOS)), None]), st.integers(0, len(RATIOS) - 1))
outcome = st.sampled_from([True] * 4 + [False]).flatmap(lambda passes: passing if passes else st.none())
KINDS = {
    "submit": st.tuples(st.just("submit"), st.integers(0, USERS - 1), st.integers(0, 4), outcome, outcome,
                        st.sampled_from([(True, True)] * 3 + [(True, False), (False, True), (False, False)])),
    "finish": st.tuples(st.just("finish"), st.integers(0, 30), outcome),  # the n-th queued run
    "delete": st.tuples(st.just("delete"), st.integers(0, 30)),
    "requeue": st.tuples(st.just("requeue"), st.integers(0, 30), st.booleans()),
    "ban": st.tuples(st.just("ban"), st.integers(0, USERS - 1)),
    "leave": st.tuples(st.just("leave"), st.integers(0, USERS - 1)),  # an account deleted; a new user in its place
    "rescore": st.tuples(st.just("rescore"), st.sampled_from(["last", "mean", "geom"])),
}
operation = st.sampled_from(["submit"] * 8 + ["finish"] * 3 + ["delete", "requeue", "ban", "rescore", "leave"]).flatmap(
    KINDS.__getitem__)


def result(spec) -> dict:
    if spec is None:
        return ranked_result([1000.0], "fail")
    first, second, ratio, other_ratio = spec
    built = ranked_result([first, second])
    if ratio is not None:
        for case, (value, low, high) in zip(built["ranked"], (RATIOS[ratio], RATIOS[other_ratio]), strict=True):
            case.update(time=case["mean"], ratio=value, ratio_low=low, ratio_high=high, reference=1000.0)
    return built


def board_state(leaderboard: Leaderboard, gpu) -> tuple:
    entries = sorted(BoardEntry.objects.filter(leaderboard=leaderboard, gpu_type=gpu).values_list(
        "user_id", "submission_id", "tied", "score", "rank_key", "ratio", "ratio_low", "ratio_high",
        "submitted_at"))
    records = sorted(Record.objects.filter(leaderboard=leaderboard, gpu_type=gpu).values_list(
        "submission_id", "user_id", "score", "submitted_at", "board_best"))
    return entries, records


def ranks_on_ratio(leaderboard: Leaderboard, gpu) -> bool | None:
    return Board.objects.filter(leaderboard=leaderboard, gpu_type=gpu).values_list("ranks_on_ratio", flat=True).first()


class Client:
    """What static/kb/site.js does with the deltas, for every row rather than the first 50, and the records."""

    def __init__(self) -> None:
        self.version, self.rows, self.records = 0, {}, []

    def apply(self, version: int, entries: list[dict], removed: list[int], shift=None) -> None:
        assert version == self.version + 1, "a delta was skipped or sent twice"
        self.version = version
        for user in removed:
            self.rows.pop(user, None)
        if shift:
            first, last, by = shift
            moved = {e["user"] for e in entries}
            for user, row in self.rows.items():
                if user not in moved and row["rank"] >= first and (last is None or row["rank"] <= last):
                    row["rank"] += by
        for e in entries:
            self.rows[e["user"]] = dict(e)


@settings(max_examples=30, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(operations=st.lists(operation, min_size=1, max_size=30))
def test_hooks_keep_the_board_the_full_rebuild_makes(operations, leaderboard, cpu_pool,
                                                    django_capture_on_commit_callbacks, monkeypatch):
    def async_task(func: str, *args, **options) -> None:  # the named task, in line, as a worker runs it
        if func != "runners.tasks.dispatch_run":  # runs finish when the test says so
            import_string(func)(*args)

    monkeypatch.setattr("runners.queue.async_task", async_task)
    monkeypatch.setattr("runners.queue.broker", lambda: None)
    client = Client()
    def board_changed(lb, gpu, *delta, records=True, record_added=None, **parts) -> None:
        client.apply(*delta)
        if records:  # the whole progression, as the event renders it after commit
            client.records = board_history(lb, gpu, [])["records"]
        elif record_added:
            client.records.append(record_added)

    monkeypatch.setattr(events, "board_changed", board_changed)
    board = Leaderboard.objects.create(name=f"prop-{Leaderboard.objects.count()}", problem=leaderboard.problem,
                                       deadline=leaderboard.deadline)
    gpu = cpu_pool.cpu
    board.gpu_types.set([gpu])
    users = [UserFactory() for _ in range(USERS)]
    subs: list = []

    def finish(run, spec) -> None:
        actions.do_ingest_result(run.pk, dispatch(run), result(spec))

    for op in operations:
        with django_capture_on_commit_callbacks(execute=True):  # the hooks run as the queue would run them
            kind, *args = op
            if kind == "submit":
                user, minute, public, secret, (finish_public, finish_secret) = args
                sub = submission(board, users[user], code=f"{len(subs)}", created=START + timedelta(minutes=minute))
                subs.append(sub)
                for run in sub.runs.all():
                    if finish_secret if run.secret else finish_public:
                        finish(run, secret if run.secret else public)
            elif kind == "rescore":
                board.ranking_by = args[0]
                board.save(update_fields=["ranking_by"])
                actions.do_rescore_leaderboard(board)
            elif kind == "ban":
                do_ban(users[args[0]], board, "property test")
            elif kind == "leave":
                gone = users[args[0]]
                subs = [sub for sub in subs if sub.user_id != gone.pk]
                gone.delete()
                users[args[0]] = UserFactory()
            elif kind == "finish":
                queued = list(Run.objects.filter(submission__leaderboard=board, status=RunStatus.QUEUED))
                if queued:
                    finish(queued[args[0] % len(queued)], args[1])
            elif subs:
                sub = subs[args[0] % len(subs)]
                if kind == "delete":
                    actions.do_delete_submission(sub)
                    subs.remove(sub)
                else:
                    run = sub.runs.get(secret=args[1])
                    if run.is_terminal:
                        actions.do_requeue_run(run)
        kept, on_ratio = board_state(board, gpu), ranks_on_ratio(board, gpu)
        with django_capture_on_commit_callbacks(execute=True):
            assert not actions.do_recompute_ranks(board.pk, gpu.pk), f"the rebuild changed the board after {op}"
        assert board_state(board, gpu) == kept, f"the rebuild changed the records after {op}"
        assert on_ratio in (None, ranks_on_ratio(board, gpu))
        read = {e.user_id: (e.submission_id, e.rank, e.tied) for e in BoardEntry.objects.filter(
            leaderboard=board, gpu_type=gpu).order_by(*BOARD_ORDER).page(0, USERS)}
        assert read == {r.user_id: (r.submission_id, r.rank, r.tied)
                        for r in rank(ranked_candidates(board.pk, gpu.pk))}, f"ranks read after {op}"
        held = {user: (row["submission"], row["rank"], row["tied"]) for user, row in client.rows.items()}
        assert held == read, f"client after {op}"
        assert client.records == board_history(board.pk, gpu.pk, [])["records"], f"client's records after {op}"
