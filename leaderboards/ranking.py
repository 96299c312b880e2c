"""Ranking maths as pure functions: scores from timings, best entry per user, shared ranks for ties,
statistical ties from the harness's intervals."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

NS_PER_SECOND = 1e9


def score_seconds(means_ns: Sequence[float], rule: str) -> float:
    """Lower is better. `last` ranks on the last benchmark only; `mean` and `geom` on all of them."""
    if not means_ns:
        raise ValueError("no ranked timings to score")
    if any(not math.isfinite(m) or m <= 0 for m in means_ns):
        raise ValueError(f"timings must be positive and finite, got {list(means_ns)}")
    if rule == "last":
        value = means_ns[-1]
    elif rule == "mean":
        value = sum(means_ns) / len(means_ns)
    elif rule == "geom":
        value = math.exp(sum(math.log(m) for m in means_ns) / len(means_ns))
    else:
        raise ValueError(f"unknown ranking rule {rule!r}")
    return value / NS_PER_SECOND


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
    both have one, else by time. The board, the API and every page use this one rule."""
    by_ratio = all(ratio is not None for _, ratio in runs)
    return max(runs, key=lambda run: run[1].value if by_ratio and run[1] is not None else run[0])


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
    """A user's best score; on equal scores their earliest submission keeps the entry."""
    candidates = list(candidates)
    key = key or ranking_key(candidates)
    best: dict[int, Candidate] = {}
    for c in candidates:
        held = best.get(c.user_id)
        if held is None or (key(c), c.submitted_at) < (key(held), held.submitted_at):
            best[c.user_id] = c
    return list(best.values())


def rank(candidates: Iterable[Candidate]) -> list[Ranked]:
    """Standard competition ranking (1, 1, 3): equal scores share a rank, earlier submission listed first.
    `tied` marks an entry whose interval does not separate it from the one ranked just above."""
    candidates = list(candidates)
    key = ranking_key(candidates)
    ordered = sorted(best_per_user(candidates, key), key=lambda c: (key(c), c.submitted_at, c.submission_id))
    ranked: list[Ranked] = []
    for position, c in enumerate(ordered, start=1):
        shared = position > 1 and key(ordered[position - 2]) == key(c)
        above = ranked[-1] if ranked else None
        tied = shared or (above is not None and c.ratio is not None and above.ratio is not None
                          and statistically_tied(above.ratio, c.ratio))
        ranked.append(Ranked(c.user_id, c.submission_id, c.score, c.submitted_at,
                             above.rank if shared and above else position, c.ratio, tied))
    return ranked
