"""Ranking maths as pure functions: scores from timings, best entry per user, shared ranks for ties."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
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
class Candidate:
    user_id: int
    submission_id: int
    score: float
    submitted_at: datetime


@dataclass(frozen=True)
class Ranked:
    user_id: int
    submission_id: int
    score: float
    submitted_at: datetime
    rank: int


def best_per_user(candidates: Iterable[Candidate]) -> list[Candidate]:
    """A user's best score; on equal scores their earliest submission keeps the entry."""
    best: dict[int, Candidate] = {}
    for c in candidates:
        held = best.get(c.user_id)
        if held is None or (c.score, c.submitted_at) < (held.score, held.submitted_at):
            best[c.user_id] = c
    return list(best.values())


def rank(candidates: Iterable[Candidate]) -> list[Ranked]:
    """Standard competition ranking (1, 1, 3): equal scores share a rank, earlier submission listed first."""
    ordered = sorted(best_per_user(candidates), key=lambda c: (c.score, c.submitted_at, c.submission_id))
    ranked: list[Ranked] = []
    for position, c in enumerate(ordered, start=1):
        shared = ranked and ranked[-1].score == c.score
        ranked.append(Ranked(c.user_id, c.submission_id, c.score, c.submitted_at,
                             ranked[-1].rank if shared else position))
    return ranked
