"""Materialised entries and records of a board (leaderboard × GPU type), always under the Board row lock.

`do_rank_result` is what a finished ranked run costs: it reads that submission's two runs and changes the board by
what the result changes (the user's entry, at most two neighbours' ties, the records) through the board's indexed
order, never reading the board's runs. Ranks are not stored (a rank is 1 + the entries with a smaller key, read
with the page: `models.number_rows`), so a result that passes 10 k entries writes one row; its event still tells
clients which ranks it moved. `do_recompute_ranks` rebuilds the board from all its runs: deletions, requeues,
rescoring, a board never built with rank keys, and the oracle in tests."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from runners.models import GpuType
from runners.queue import enqueue_on_commit

from . import events
from .history import stamp
from .models import BOARD_ORDER as ORDER
from .models import Board, BoardEntry, Record, Run, RunStatus, Submission, SubmissionMode, number_rows
from .ranking import (
    Candidate,
    interval_from_fields,
    progression,
    rank,
    ratio_fields,
    slower_run,
    tied_below,
)

ENTRY_FIELDS = ["submission_id", "score", "rank_key", "submitted_at", "tied", "ratio", "ratio_low",
                "ratio_high"]
ENTRIES, RECORDS = BoardEntry._meta.db_table, Record._meta.db_table
RUNS, SUBMISSIONS = Run._meta.db_table, Submission._meta.db_table
RECOMPUTE_TASK = "leaderboards.tasks.recompute_ranks"
RUN_FIELDS = ("submission_id", "submission__user_id", "submission__created", "secret", "status", "passed", "score",
              "ratio", "ratio_low", "ratio_high")


def _candidates(rows) -> list[Candidate]:
    """Submissions whose public AND secret ranked runs both passed; scored on the slower of the two (by the ratio
    when both runs have one, else by time), time and ratio taken from that run."""
    by_submission: dict[int, dict] = {}
    for submission_id, user_id, created, secret, status, passed, score, ratio, low, high in rows:
        entry = by_submission.setdefault(submission_id, {"user": user_id, "created": created, "runs": {}})
        if status == RunStatus.SUCCEEDED and passed and score is not None:
            entry["runs"][secret] = (score, interval_from_fields(ratio, low, high))
    candidates = []
    for sid, e in by_submission.items():
        if len(e["runs"]) == 2:
            runs = list(e["runs"].values())
            score, ratio = slower_run(runs)
            by_ratio = all(r is not None for _, r in runs)
            candidates.append(Candidate(e["user"], sid, score, e["created"], ratio if by_ratio else None))
    return candidates


def ranked_candidates(leaderboard_id: int, gpu_type_id: int) -> list[Candidate]:
    """Every ranked submission of the board (see `_candidates`); unsorted, so the database does not sort them."""
    return _candidates(Run.objects.ranked().filter(
        submission__leaderboard_id=leaderboard_id, gpu_type_id=gpu_type_id).order_by().values_list(*RUN_FIELDS))


# The statements every result runs are raw: building them through the ORM cost more than running them. Ranked runs
# are `Run.objects.ranked()`'s: those of leaderboard-mode submissions.
CANDIDATE_SQL = (f"SELECT r.submission_id, s.user_id, s.created, r.secret, r.status, r.passed, r.score, r.ratio, "
                 f"r.ratio_low, r.ratio_high FROM {RUNS} r JOIN {SUBMISSIONS} s ON s.id = r.submission_id "
                 f"WHERE r.submission_id = %s AND r.gpu_type_id = %s AND s.mode = %s")
BOARD_OF_RUN_SQL = (f"SELECT b.id, b.version, b.ranks_on_ratio, g.name, b.leaderboard_id, b.gpu_type_id, "
                    f"r.submission_id FROM {RUNS} r JOIN {SUBMISSIONS} s ON s.id = r.submission_id "
                    f"JOIN {Board._meta.db_table} b ON b.leaderboard_id = s.leaderboard_id AND b.gpu_type_id = "
                    f"r.gpu_type_id JOIN {GpuType._meta.db_table} g ON g.id = b.gpu_type_id "
                    f"WHERE r.id = %s AND s.mode = %s")


def _aware(moment: datetime) -> datetime:
    """A datetime read with a raw cursor: SQLite's are naive UTC."""
    return moment if timezone.is_aware(moment) else moment.replace(tzinfo=UTC)


def submission_candidate(submission_id: int, gpu_type_id: int) -> Candidate | None:
    with connection.cursor() as cursor:
        cursor.execute(CANDIDATE_SQL, [submission_id, gpu_type_id, SubmissionMode.LEADERBOARD])
        rows = [(sid, user, _aware(created), *rest) for sid, user, created, *rest in cursor.fetchall()]
    found = _candidates(rows)
    return found[0] if found else None


def _board_of_run(run_id: int) -> tuple[Board | None, int]:
    """A ranked run's board, locked, and its submission: one statement when the board exists. (None, 0) when the
    run is gone or not ranked."""
    with connection.cursor() as cursor:
        lock = " FOR UPDATE OF b" if connection.features.has_select_for_update_of else ""
        cursor.execute(BOARD_OF_RUN_SQL + lock, [run_id, SubmissionMode.LEADERBOARD])
        row = cursor.fetchone()
    if row is None:  # the board's first result, or no ranked run
        found = Run.objects.ranked().filter(pk=run_id).values_list(
            "submission_id", "gpu_type_id", "submission__leaderboard_id").first()
        if found is None:
            return None, 0
        submission_id, gpu_type_id, leaderboard_id = found
        return _locked_board(leaderboard_id, gpu_type_id), submission_id
    pk, version, on_ratio, gpu_name, leaderboard_id, gpu_type_id, submission_id = row
    board = Board(pk=pk, leaderboard_id=leaderboard_id, version=version,
                  ranks_on_ratio=None if on_ratio is None else bool(on_ratio),
                  gpu_type=GpuType(pk=gpu_type_id, name=gpu_name))
    board._state.adding = False
    return board, submission_id


def _locked_board(leaderboard_id: int, gpu_type_id: int) -> Board:
    """The board's row, locked (with its GPU type's name, for the event); created on its first result."""
    locked = Board.objects.select_for_update(of=("self",)).select_related("gpu_type").filter(
        leaderboard_id=leaderboard_id, gpu_type_id=gpu_type_id)
    board = locked.first()
    if board is None:
        Board.objects.get_or_create(leaderboard_id=leaderboard_id, gpu_type_id=gpu_type_id)
        board = locked.get()
    return board


def _delta_row(values: dict[str, Any], user_id: int) -> dict[str, Any]:
    return {"user": user_id, "submission": values["submission_id"], "score": values["score"],
            "rank": values["rank"], "tied": values["tied"], "ratio": values["ratio"]}


def _publish(board: Board, delta: list[dict], removed: list[int], shift: list | None = None, *,
             entrants: bool = True, records: bool | list = True) -> None:
    """Bump the board's version and send the delta after commit; `entrants`/`records`: whether the number of
    entries or the board's records may have changed (the event then carries them rendered); `records` a record
    ([iso time, figure, user id]): the one record appended to the progression."""
    board.version += 1
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {Board._meta.db_table} SET version = %s, ranks_on_ratio = %s, updated = %s "
                       "WHERE id = %s", [board.version, board.ranks_on_ratio, _db_now(), board.pk])
    leaderboard_id, gpu_type_id, version = board.leaderboard_id, board.gpu_type_id, board.version
    gpu_name, added = board.gpu_type.name, records if isinstance(records, list) else None
    on_ratio = bool(board.ranks_on_ratio)
    transaction.on_commit(lambda: events.board_changed(leaderboard_id, gpu_type_id, version, delta, removed, shift,
                                                       entrants=entrants, records=records is True,
                                                       record_added=added, gpu_name=gpu_name, on_ratio=on_ratio))


# --- the full rebuild -------------------------------------------------------------------------------


def do_recompute_ranks(leaderboard_id: int, gpu_type_id: int) -> bool:
    """Rewrite one board's ranks and records from all its runs; emits one event when an entry changed."""
    with transaction.atomic():
        return _rebuild(_locked_board(leaderboard_id, gpu_type_id))


def _rebuild(board: Board) -> bool:
    leaderboard_id, gpu_type_id = board.leaderboard_id, board.gpu_type_id
    candidates = ranked_candidates(leaderboard_id, gpu_type_id)
    on_ratio = all(c.ratio is not None for c in candidates)
    records = _rebuild_records(leaderboard_id, gpu_type_id, candidates)
    ranked = rank(candidates)
    existing = {e.user_id: e for e in number_rows(list(BoardEntry.objects.filter(
        leaderboard_id=leaderboard_id, gpu_type_id=gpu_type_id).order_by(*ORDER)), 0)}
    to_create, to_update, delta = [], [], []
    for r in ranked:
        entry = existing.pop(r.user_id, None)
        values = {"submission_id": r.submission_id, "score": r.score, "submitted_at": r.submitted_at,
                  "rank_key": r.ratio.value if on_ratio and r.ratio else r.score, "tied": r.tied,
                  **ratio_fields(r.ratio)}
        if entry is None:
            to_create.append(BoardEntry(leaderboard_id=leaderboard_id, gpu_type_id=gpu_type_id, user_id=r.user_id,
                                        **values))
        elif any(getattr(entry, k) != v for k, v in values.items()):
            for k, v in values.items():
                setattr(entry, k, v)
            to_update.append(entry)
        elif entry.rank == r.rank:
            continue
        delta.append(_delta_row({**values, "rank": r.rank}, r.user_id))
    if existing:
        BoardEntry.objects.filter(pk__in=[e.pk for e in existing.values()]).delete()
    BoardEntry.objects.bulk_create(to_create)
    _write_entries(to_update)
    changed = bool(to_create or to_update or existing)
    if not (changed or records):
        if board.ranks_on_ratio != on_ratio:
            board.ranks_on_ratio = on_ratio
            board.save(update_fields=["ranks_on_ratio"])
        return False
    board.ranks_on_ratio = on_ratio
    _publish(board, delta, list(existing), entrants=changed, records=records)
    return True


# One statement for any number of changed entries: Django's bulk_update writes a CASE with a branch per row, which
# PostgreSQL evaluates per row (quadratic: a rebuild that changed 10 k entries took minutes).
UPDATE_ENTRIES_SQL = f"""
UPDATE {BoardEntry._meta.db_table} e SET submission_id = v.submission_id, score = v.score, rank_key = v.rank_key,
  submitted_at = v.submitted_at, tied = v.tied, ratio = v.ratio, ratio_low = v.ratio_low, ratio_high = v.ratio_high,
  updated = now()
FROM unnest(%s::bigint[], %s::bigint[], %s::float8[], %s::float8[], %s::timestamptz[], %s::bool[], %s::float8[],
  %s::float8[], %s::float8[]) AS v(id, submission_id, score, rank_key, submitted_at, tied, ratio, ratio_low,
  ratio_high)
WHERE e.id = v.id
"""


def _write_entry(entry: BoardEntry) -> None:
    """Save an existing entry's ranking fields (one raw UPDATE: this is every improving result's write)."""
    with connection.cursor() as cursor:
        values = [_db_time(v) if isinstance(v, datetime) else v for v in (getattr(entry, f) for f in ENTRY_FIELDS)]
        cursor.execute(f"UPDATE {ENTRIES} SET {', '.join(f'{f} = %s' for f in ENTRY_FIELDS)}, updated = %s "
                       "WHERE id = %s", [*values, _db_now(), entry.pk])


def _write_entries(entries: list[BoardEntry]) -> None:
    if not entries:
        return
    if connection.vendor != "postgresql":
        BoardEntry.objects.bulk_update(entries, ENTRY_FIELDS, batch_size=200)
        return
    with connection.cursor() as cursor:
        cursor.execute(UPDATE_ENTRIES_SQL, [[e.pk for e in entries]]
                       + [[getattr(e, f) for e in entries] for f in ENTRY_FIELDS])


def _rebuild_records(leaderboard_id: int, gpu_type_id: int, candidates: list[Candidate]) -> bool:
    """Rewrite the progressions; whether they changed."""
    steps = {s.submission_id: s for s in progression(candidates)}
    held = Record.objects.filter(leaderboard_id=leaderboard_id, gpu_type_id=gpu_type_id)
    stale, changed = [], []
    for record in held:
        step = steps.pop(record.submission_id, None)
        if step is None:
            stale.append(record.pk)
        elif (record.user_id, record.score, record.submitted_at, record.board_best) != (
                step.user_id, step.score, step.submitted_at, step.board_best):
            record.user_id, record.score = step.user_id, step.score
            record.submitted_at, record.board_best = step.submitted_at, step.board_best
            changed.append(record)
    if stale:
        Record.objects.filter(pk__in=stale).delete()
    Record.objects.bulk_update(changed, ["user_id", "score", "submitted_at", "board_best"], batch_size=200)
    Record.objects.bulk_create([Record(leaderboard_id=leaderboard_id, gpu_type_id=gpu_type_id, user_id=s.user_id,
                                       submission_id=s.submission_id, score=s.score, submitted_at=s.submitted_at,
                                       board_best=s.board_best) for s in steps.values()])
    return bool(stale or changed or steps)


# --- one result ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Place:
    """A position in the board's order: (rank key, submitted at, submission id), ascending."""

    key: float
    submitted_at: Any
    submission_id: int

    @classmethod
    def of(cls, entry: BoardEntry) -> Place:
        return cls(entry.rank_key, entry.submitted_at, entry.submission_id)  # type: ignore[arg-type]

    def as_tuple(self) -> tuple:
        return self.key, self.submitted_at, self.submission_id


# A board's neighbours of a place, each a walk of the board's index (entry_board_order) from the place: a row
# comparison, which PostgreSQL and SQLite both match to the index. Raw, as these and the record probes below are the
# statements of every result, and building them through the ORM cost more than running them.
PROBE_SQL = (f"(SELECT id FROM {ENTRIES} WHERE leaderboard_id = %s AND gpu_type_id = %s AND user_id <> %s "
             "AND (rank_key, submitted_at, submission_id) {op} (%s, %s, %s) "
             "ORDER BY rank_key {order}, submitted_at {order}, submission_id {order} LIMIT 1)")


def _db_time(value: Any) -> Any:
    return connection.ops.adapt_datetimefield_value(value)


def _db_now() -> Any:
    """The time an `updated` column gets from a raw statement (auto_now's value)."""
    return _db_time(timezone.now())


def _neighbours(board: Board, user_id: int, *places: Place) -> list[BoardEntry | None]:
    """Other users' entries right above and right below each place, [above 1, below 1, above 2, ...], in one
    statement (the probes as scalar subqueries: a UNION of ordered probes SQLite does not take)."""
    probes, params = [], []
    for place in places:
        at = _db_time(place.submitted_at)
        for op, order in (("<", "DESC"), (">", "ASC")):
            probes.append(PROBE_SQL.format(op=op, order=order))
            params += [board.leaderboard_id, board.gpu_type_id, user_id, place.key, at, place.submission_id]
    found = [(Place.of(e).as_tuple(), e)
             for e in BoardEntry.objects.raw(f"SELECT * FROM {ENTRIES} WHERE id IN ({', '.join(probes)})", params)]
    out: list[BoardEntry | None] = []
    for place in map(Place.as_tuple, places):  # (each probe's row is the nearest of those found on its side)
        out.append(max(((at, e) for at, e in found if at < place), key=lambda f: f[0], default=(None, None))[1])
        out.append(min(((at, e) for at, e in found if at > place), key=lambda f: f[0], default=(None, None))[1])
    return out


def _any_after(entries: QuerySet, key: float, follower: BoardEntry | None) -> bool:
    """Whether any entry has a key above `key`, given `follower`, the first entry after a place with that key."""
    if follower is None or follower.rank_key > key:
        return follower is not None
    return entries.filter(rank_key__gt=key).exists()  # (the follower has the same key)


def _tied(entry: BoardEntry, above: BoardEntry | None) -> bool:
    return above is not None and tied_below(
        above.rank_key, interval_from_fields(above.ratio, above.ratio_low, above.ratio_high),  # type: ignore[arg-type]
        entry.rank_key, interval_from_fields(entry.ratio, entry.ratio_low, entry.ratio_high))  # type: ignore[arg-type]


def _retie(follower: BoardEntry, above: BoardEntry | None, rank: int | None = None) -> dict[str, Any] | None:
    """Redo `follower`'s tie with `above`, the entry now right above it; its delta row when that changed, with
    `rank`, its rank when known (else counted)."""
    tied = _tied(follower, above)
    if tied == follower.tied:
        return None
    follower.tied = tied
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {ENTRIES} SET tied = %s, updated = %s WHERE id = %s",
                       [tied, _db_now(), follower.pk])
        if rank is None:
            cursor.execute(f"SELECT COUNT(*) FROM {ENTRIES} WHERE leaderboard_id = %s AND gpu_type_id = %s "
                           "AND rank_key < %s", [follower.leaderboard_id, follower.gpu_type_id, follower.rank_key])
            rank = cursor.fetchone()[0] + 1
    return _delta_row({f: getattr(follower, f) for f in ENTRY_FIELDS} | {"rank": rank}, follower.user_id)


def do_rank_result(run_id: int) -> bool:
    """Apply one finished ranked run to its board: when its submission now has both runs passed, a record if it
    is one, and the user's entry if it beats it. Idempotent; emits one event when an entry or a record changed."""
    with transaction.atomic():
        board, submission_id = _board_of_run(run_id)
        if board is None:
            return False
        leaderboard_id, gpu_type_id = board.leaderboard_id, board.gpu_type_id
        if board.ranks_on_ratio is None:
            return _rebuild(board)
        candidate = submission_candidate(submission_id, gpu_type_id)
        if candidate is None:  # not (or no longer: a requeued run) both passed; undo it if the board counts it
            counted = Q(submission_id=submission_id, leaderboard_id=leaderboard_id, gpu_type_id=gpu_type_id)
            if BoardEntry.objects.filter(counted).exists() or Record.objects.filter(counted).exists():
                return _rebuild(board)
            return False
        if board.ranks_on_ratio and candidate.ratio is None:
            return _rebuild(board)  # the board ranks on time from now on (ranking.ranking_key)
        records = _add_record(board, candidate)
        if _place_entry(board, candidate, records):
            return True
        if records:  # a record in its time (submitted before the user's best, finished after it): the chart
            _publish(board, [], [], entrants=False, records=records)
        return bool(records)


# What a result's record needs to know of the progressions, in one statement: whether it is in them already, the
# user's last step and the board's last record before it, whether it beats later steps of the user and later
# records, and whether any record follows it (else it is appended).
_ON_BOARD = f"FROM {RECORDS} WHERE leaderboard_id = %s AND gpu_type_id = %s"
RECORD_SQL = f"""SELECT EXISTS (SELECT 1 {_ON_BOARD} AND submission_id = %s),
  (SELECT score {_ON_BOARD} AND user_id = %s AND (submitted_at, submission_id) < (%s, %s)
   ORDER BY submitted_at DESC, submission_id DESC LIMIT 1),
  (SELECT score {_ON_BOARD} AND board_best AND (submitted_at, submission_id) < (%s, %s)
   ORDER BY submitted_at DESC, submission_id DESC LIMIT 1),
  EXISTS (SELECT 1 {_ON_BOARD} AND user_id = %s AND (submitted_at, submission_id) > (%s, %s) AND score >= %s),
  EXISTS (SELECT 1 {_ON_BOARD} AND board_best AND (submitted_at, submission_id) > (%s, %s) AND score >= %s),
  EXISTS (SELECT 1 {_ON_BOARD} AND board_best AND (submitted_at, submission_id) > (%s, %s))"""


def _add_record(board: Board, c: Candidate) -> bool | list:
    """Insert `c` into the progressions (see ranking.progression) if it is a step: it beats the user's last step
    before it; it is a record if it also beats the board's last record before it. Later steps of the user and
    later records it beats stop being steps and records (a result can arrive after later submissions'). Returns
    whether the board's records changed (only a new record changes them: a later record it beats, the user's own
    included, is beaten by a record): the record, [iso time, seconds, user id], when it was appended to the
    progression (no record after it), else True. Steps and records are on what the board ranks on (the ratio when it
    ranks on it, else the time). What it needs to know is read in one statement."""
    figure = c.ratio.value if board.ranks_on_ratio and c.ratio else c.score
    board_key, place = [board.leaderboard_id, board.gpu_type_id], [_db_time(c.submitted_at), c.submission_id]
    with connection.cursor() as cursor:
        cursor.execute(RECORD_SQL, [*board_key, c.submission_id, *board_key, c.user_id, *place, *board_key, *place,
                                    *board_key, c.user_id, *place, figure, *board_key, *place, figure,
                                    *board_key, *place])
        held, mine, record, beats_mine, beats_records, records_after = cursor.fetchone()
    if held or (mine is not None and figure >= mine):
        return False
    board_best = record is None or figure < record
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {RECORDS} (leaderboard_id, gpu_type_id, user_id, submission_id, score, "
                       "submitted_at, board_best) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                       [*board_key, c.user_id, c.submission_id, figure, place[0], board_best])
    if beats_mine or (board_best and beats_records):
        later = Q(submitted_at__gt=c.submitted_at) | Q(submitted_at=c.submitted_at, submission_id__gt=c.submission_id)
        beaten = Record.objects.filter(later, leaderboard_id=board.leaderboard_id, gpu_type_id=board.gpu_type_id,
                                       score__gte=figure)
        if beats_mine:
            beaten.filter(user_id=c.user_id).delete()
        if board_best and beats_records:
            beaten.filter(board_best=True).update(board_best=False)
    if board_best and not records_after:
        return [stamp(c.submitted_at), figure, c.user_id]
    return board_best


# The numbers a move needs, counted over the board's index alone: entries with a smaller key than the new one (its
# rank), with at most that key, passed on the way up from the old key, and with a smaller key than the old one.
COUNTS_SQL = (f"SELECT COUNT(CASE WHEN rank_key < %s THEN 1 END), COUNT(CASE WHEN rank_key <= %s THEN 1 END), "
              f"COUNT(CASE WHEN rank_key > %s THEN 1 END), COUNT(CASE WHEN rank_key < %s THEN 1 END) "
              f"FROM {ENTRIES} WHERE leaderboard_id = %s AND gpu_type_id = %s AND rank_key <= %s")


def _place_entry(board: Board, c: Candidate, records: bool | list = False) -> bool:
    """Put `c` in place of its user's entry if it is better. A rank is 1 + the number of entries with a smaller key,
    so moving from key `old` to `key` adds one to the ranks of the entries in (key, old] and nothing elsewhere: the
    event tells clients so, and one index-only count finds the numbers. Ties depend only on the entry above, so the
    moved entry and its old and new followers are the only ones whose `tied` can change."""
    entries = BoardEntry.objects.filter(leaderboard_id=board.leaderboard_id, gpu_type_id=board.gpu_type_id)
    key = c.ratio.value if board.ranks_on_ratio and c.ratio else c.score
    place = Place(key, c.submitted_at, c.submission_id)
    held = next(iter(BoardEntry.objects.raw(
        f"SELECT * FROM {ENTRIES} WHERE leaderboard_id = %s AND gpu_type_id = %s AND user_id = %s",
        [board.leaderboard_id, board.gpu_type_id, c.user_id])), None)
    values = {"submission_id": c.submission_id, "score": c.score, "rank_key": key, "submitted_at": c.submitted_at,
              **ratio_fields(c.ratio)}
    if held is not None:
        if held.submission_id == c.submission_id:
            if all(getattr(held, k) == v for k, v in values.items()):
                return False  # already applied
            return _rebuild(board)  # its scored runs changed under the entry (requeued and run again)
        if Place.of(held).as_tuple() <= place.as_tuple():
            return False
    above, follower, *old_neighbours = _neighbours(board, c.user_id, place, *([Place.of(held)] if held else []))
    # counted over the board's index alone (held's own row included: old >= key, so it is never smaller than key,
    # it is at most key only when old == key, and it lies in (key, old] otherwise)
    old = held.rank_key if held else key
    with connection.cursor() as cursor:
        cursor.execute(COUNTS_SQL, [key, key, key, old, board.leaderboard_id, board.gpu_type_id, max(key, old)])
        smaller, upto, passed, old_smaller = cursor.fetchone()
    if held is None:
        moved, old_rank = _any_after(entries, key, follower), None
    else:
        upto -= old == key
        moved, old_rank = passed - (old > key) > 0, old_smaller + 1
    entry = held or BoardEntry(leaderboard_id=board.leaderboard_id, gpu_type_id=board.gpu_type_id, user_id=c.user_id)
    for k, v in values.items():
        setattr(entry, k, v)
    entry.tied = _tied(entry, above)
    if held is None:
        entry.save()
    else:
        _write_entry(entry)
    delta = [_delta_row({**values, "rank": smaller + 1, "tied": entry.tied}, c.user_id)]
    # the entry now sits right above its new follower, which ranks with it (same key) or right after the entries of
    # at most its key, itself included; its old follower, if another, has the entry that was above the old place
    # above it (it lies after the new follower)
    reties = [(follower, entry, None if follower is None else smaller + 1 if follower.rank_key == key else upto + 2)]
    if old_neighbours and old_neighbours[1] is not None and (follower is None or old_neighbours[1].pk != follower.pk):
        reties.append((old_neighbours[1], old_neighbours[0], None))
    delta += [row for lower, upper, rank in reties if lower is not None and (row := _retie(lower, upper, rank))]
    # old ranks the move shifted, for clients holding rows: [first, last, by]; the held entry's old rank is the last;
    # none for a new entry
    shift = [upto + 1, old_rank, 1] if moved else None
    _publish(board, delta, [], shift, entrants=held is None, records=records)
    return True


def ratioless_boards(submission_id: int) -> set[tuple[int, int]]:
    """The boards on which the submission ranks without a ratio. Such a submission makes its board rank on time;
    when it goes (deleted, a run requeued), the board may rank on the ratio again, which only a rebuild finds."""
    boards = Run.objects.ranked().filter(submission_id=submission_id).order_by().values_list(
        "submission__leaderboard_id", "gpu_type_id").distinct()
    return {(leaderboard_id, gpu_type_id) for leaderboard_id, gpu_type_id in boards
            if (c := submission_candidate(submission_id, gpu_type_id)) is not None and c.ratio is None}


def do_take_off_boards(submission_id: int) -> set[tuple[int, int]]:
    """Before a submission is deleted: remove its entries from their boards (the ranks after it move up one, the
    follower's tie is redone) and its board records, so clients hear that the user left and the chart changed;
    returns the boards it held an entry or a record on or ranks on without a ratio, to rebuild after the deletion
    (the user's next best, the progressions, the rank key)."""
    records = Record.objects.filter(submission_id=submission_id)
    boards = set(records.values_list("leaderboard_id", "gpu_type_id")) | ratioless_boards(submission_id)
    charts = set(records.filter(board_best=True).values_list("leaderboard_id", "gpu_type_id"))
    for held in BoardEntry.objects.filter(submission_id=submission_id):
        boards.add((held.leaderboard_id, held.gpu_type_id))
        charts.discard((held.leaderboard_id, held.gpu_type_id))  # (its event carries the records)
        board = _locked_board(held.leaderboard_id, held.gpu_type_id)
        entries = BoardEntry.objects.filter(leaderboard_id=held.leaderboard_id, gpu_type_id=held.gpu_type_id)
        held = entries.get(pk=held.pk)  # as it is under the lock
        rank = entries.ahead_of(held).count() + 1
        above, follower = _neighbours(board, held.user_id, Place.of(held))
        held.delete()
        delta = [row] if follower is not None and (row := _retie(follower, above)) else []
        moved = _any_after(entries, held.rank_key, follower)
        _publish(board, delta, [held.user_id], [rank + 1, None, -1] if moved else None)
    for leaderboard_id, gpu_type_id in charts:  # a record, not the user's entry: the ranking keeps its rows
        _publish(_locked_board(leaderboard_id, gpu_type_id), [], [], entrants=False)
    return boards


def do_take_user_off_boards(user_id: int) -> set[tuple[int, int]]:
    """Before a user is deleted (their submissions, entries and records go by cascade): each submission of theirs
    that holds an entry or a board record is taken off as `do_take_off_boards` does, so clients hear it; returns
    every board they ranked on, to rebuild after the deletion (later records, the rank key)."""
    held = set(BoardEntry.objects.filter(user_id=user_id).values_list("submission_id", flat=True))
    held |= set(Record.objects.filter(user_id=user_id, board_best=True).values_list("submission_id", flat=True))
    boards = set(Run.objects.ranked().filter(submission__user_id=user_id).order_by().values_list(
        "submission__leaderboard_id", "gpu_type_id").distinct())
    for submission_id in sorted(held):
        boards |= do_take_off_boards(submission_id)
    return boards


def user_deleting(sender, instance, **kwargs) -> None:
    """`pre_delete` of a user: inside the deletion's transaction, before the cascade."""
    for board in do_take_user_off_boards(instance.pk):
        enqueue_on_commit(RECOMPUTE_TASK, *board)

