"""Ranking maths as pure functions: scores from timings, best entry per user, shared ranks for ties,
statistical ties from the harness's intervals."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Interval:
    """A ranked figure with its 95 % interval (the ratio to the reference the harness timed alongside)."""

    value: float
    low: float
    high: float


def ratio_from_timings(timings: Sequence[dict], rule: str) -> Interval | None:
    """The ranking rule applied to the harness's per-case ratios and bounds (`ratio`, `ratio_low`,
    `ratio_high`); None when a case has none (older results, the popcorn protocol). Bounds combine like the
    values, as if the cases' errors were fully correlated, which never understates the interval; `mean`
    weighs the cases by the reference's times, like a mean of times would."""
    try:
        cases = [(float(t["ratio"]), float(t.get("ratio_low") or 0.0), float(t.get("ratio_high") or math.inf),
                  float(t.get("reference") or 1.0)) for t in timings]
    except (KeyError, TypeError, ValueError):
        return None
    if not cases or any(not math.isfinite(v) or v <= 0 for v, *_ in cases):
        return None
    if rule == "last":
        return Interval(*cases[-1][:3])
    if rule == "mean":
        total = sum(w for *_, w in cases)
        return Interval(*(sum(c[i] * c[3] for c in cases) / total for i in range(3)))
    if rule == "geom":
        def geom(values: list[float]) -> float:
            if min(values) <= 0:
                return 0.0
            return math.exp(sum(math.log(v) for v in values) / len(values))
        return Interval(*(geom([c[i] for c in cases]) for i in range(3)))
    raise ValueError(f"unknown ranking rule {rule!r}")


def slower_run(runs: Sequence[tuple[float, Interval | None]]) -> tuple[float, Interval | None]:
    """The (time, ratio) a submission is scored on: the slower of its public and secret runs, by the ratio when
    both have one, else by time. The board, the API and every page use this one rule. Ties are broken on the rest
    (time, then the interval), never on the order the runs were read in: the database returns a submission's runs in
    any order, and the incremental ranks and a rebuild read them differently."""
    by_ratio = all(ratio is not None for _, ratio in runs)
    if by_ratio:
        return max(runs, key=lambda run: (run[1].value, run[0], run[1].high, run[1].low))
    return max(runs, key=lambda run: (run[0], *((1, run[1].value, run[1].high, run[1].low) if run[1] else (0,) * 4)))


def statistically_tied(a: Interval, b: Interval) -> bool:
    """Whether two estimates cannot be told apart at 95 %: their difference (in log space, where the harness's
    intervals live) is within the combined half-widths of the sides that face each other. An entry without a
    finite interval ties with everything."""
    fast, slow = sorted((a, b), key=lambda i: i.value)
    if not (fast.value > 0 and slow.low > 0 and math.isfinite(fast.high)):
        return True
    return math.log(slow.value / fast.value) <= math.hypot(math.log(fast.high / fast.value),
                                                            math.log(slow.value / slow.low))


@dataclass(frozen=True)
class Candidate:
    user_id: int
    submission_id: int
    score: float  # seconds
    submitted_at: datetime
    ratio: Interval | None = None


@dataclass(frozen=True)
class Ranked:
    user_id: int
    submission_id: int
    score: float
    submitted_at: datetime
    rank: int
    ratio: Interval | None = None
    tied: bool = False  # statistically tied with the entry ranked just above


def ranking_key(candidates: Sequence[Candidate]) -> Callable[[Candidate], float]:
    """What a board ranks on: the ratio when every candidate has one (it cancels the host's speed), else the
    time in seconds for all (a board never compares a ratio with a time)."""
    if candidates and all(c.ratio is not None for c in candidates):
        return lambda c: c.ratio.value  # type: ignore[union-attr]
    return lambda c: c.score


def best_per_user(candidates: Iterable[Candidate], key: Callable[[Candidate], float] | None = None) -> list[Candidate]:
    """A user's best score; on equal scores their earliest submission (then the lowest id) keeps the entry."""
    candidates = list(candidates)
    key = key or ranking_key(candidates)
    best: dict[int, Candidate] = {}
    for c in candidates:
        held = best.get(c.user_id)
        if held is None or (key(c), c.submitted_at, c.submission_id) < (key(held), held.submitted_at,
                                                                         held.submission_id):
            best[c.user_id] = c
    return list(best.values())


def tied_below(above_key: float, above_ratio: Interval | None, key: float, ratio: Interval | None) -> bool:
    """Whether an entry is tied with the one ranked just above it: an equal key (a shared rank), or intervals
    that do not separate them."""
    return above_key == key or (above_ratio is not None and ratio is not None
                                and statistically_tied(above_ratio, ratio))


def rank(candidates: Iterable[Candidate]) -> list[Ranked]:
    """Standard competition ranking (1, 1, 3): equal scores share a rank, earlier submission listed first.
    `tied` marks an entry whose interval does not separate it from the one ranked just above."""
    candidates = list(candidates)
    key = ranking_key(candidates)
    ordered = sorted(best_per_user(candidates, key), key=lambda c: (key(c), c.submitted_at, c.submission_id))
    ranked: list[Ranked] = []
    for position, c in enumerate(ordered, start=1):
        above = ordered[position - 2] if position > 1 else None
        shared = above is not None and key(above) == key(c)
        tied = above is not None and tied_below(key(above), above.ratio, key(c), c.ratio)
        ranked.append(Ranked(c.user_id, c.submission_id, c.score, c.submitted_at,
                             ranked[-1].rank if shared else position, c.ratio, tied))
    return ranked


@dataclass(frozen=True)
class Step:
    """A submission that beat every earlier one of its user on the board (in submission order, on what the board
    ranks on: `score` is that figure); `board_best` when it also beat every earlier submission on the board."""

    user_id: int
    submission_id: int
    score: float
    submitted_at: datetime
    board_best: bool


def progression(candidates: Iterable[Candidate]) -> list[Step]:
    """Each user's improving steps and the board's records, in submission order (ties: lower id first), on what the
    board ranks on (`ranking_key`: the ratio, or the time), so the lowest record is rank 1; a figure equal to the
    best so far is no step."""
    candidates = list(candidates)
    key = ranking_key(candidates)
    steps: list[Step] = []
    mine: dict[int, float] = {}
    best = math.inf
    for c in sorted(candidates, key=lambda c: (c.submitted_at, c.submission_id)):
        figure = key(c)
        if figure < mine.get(c.user_id, math.inf):
            mine[c.user_id] = figure
            steps.append(Step(c.user_id, c.submission_id, figure, c.submitted_at, figure < best))
            best = min(best, figure)
    return steps


def ratio_fields(ratio: Interval | None) -> dict[str, float | None]:
    """Model fields; an unbounded interval side is stored as null."""
    if ratio is None:
        return {"ratio": None, "ratio_low": None, "ratio_high": None}
    return {"ratio": ratio.value, "ratio_low": ratio.low or None,
            "ratio_high": ratio.high if math.isfinite(ratio.high) else None}


def interval_from_fields(ratio: float | None, low: float | None, high: float | None) -> Interval | None:
    """The inverse of `ratio_fields`."""
    return None if ratio is None else Interval(ratio, low or 0.0, math.inf if high is None else high)
