"""The one planner: where and when each queued request starts. Pure (no Django), so the queue's start times, the ETA
`availability` shows, extension checks and the benchmark all call the same function.

First come first served with backfill: requests are placed in queue order, each at the earliest time some node has
`count` of its devices free for its whole duration, given the holds and every earlier placement; so a later request
never delays an earlier one. A device free now but promised to an earlier request later has a hole until then, which
a later, shorter request may fill now (backfill). Times are seconds (floats)."""

from __future__ import annotations

import math
from bisect import insort
from collections.abc import Hashable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Device:
    id: int
    node: int
    busy_until: float  # end of the hold on it now (<= now when free)


@dataclass(frozen=True)
class Request:
    key: Hashable
    count: int
    seconds: float


@dataclass(frozen=True)
class Placement:
    start: float
    node: int
    devices: tuple[int, ...]


def plan(now: float, devices: Iterable[Device], requests: Iterable[Request]) -> dict[Hashable, Placement | None]:
    """Placement per request key; None when no node has that many devices."""
    free_after: dict[int, float] = {}  # device → end of its last hold or placement
    hole_until: dict[int, float] = {}  # device free now → start of the first placement on it (inf: none)
    by_node: dict[int, list[int]] = {}
    for d in devices:
        free_after[d.id] = max(d.busy_until, now)
        by_node.setdefault(d.node, []).append(d.id)
        if d.busy_until <= now:
            hole_until[d.id] = math.inf
    # per node, its devices' free_after values sorted: the c-th smallest is when c of them are free
    profile = {node: sorted((free_after[i], i) for i in ids) for node, ids in by_node.items()}
    free_now = {node: {i for i in ids if i in hole_until} for node, ids in by_node.items()}
    free_now = {node: ids for node, ids in free_now.items() if ids}
    placements: dict[Hashable, Placement | None] = {}
    for req in requests:
        placed = _backfill(now, req, free_now, hole_until)
        if placed is None:
            placed = _earliest(now, req, profile)
        placements[req.key] = placed
        if placed is None:
            continue
        end = placed.start + req.seconds
        entries = profile[placed.node]
        for dev in placed.devices:
            if placed.start <= now:  # starts now: its hole (if any) is used up
                free_now[placed.node].discard(dev)
                if hole_until.pop(dev, math.inf) < math.inf:
                    continue  # a later placement already ends after this one
            elif dev in hole_until:
                hole_until[dev] = min(hole_until[dev], placed.start)
            entries.remove((free_after[dev], dev))
            free_after[dev] = end
            insort(entries, (end, dev))
        if placed.node in free_now and not free_now[placed.node]:
            del free_now[placed.node]
    return placements


def _backfill(now: float, req: Request, free_now: dict[int, set[int]],
              hole_until: dict[int, float]) -> Placement | None:
    """Start now on devices free now and not promised before the request would end; on the node where it fits most
    tightly (fewest spare devices, then the shortest holes)."""
    best = None
    for node, ids in free_now.items():
        if len(ids) < req.count:
            continue
        fitting = sorted((hole_until[i], i) for i in ids if hole_until[i] - now >= req.seconds)
        if len(fitting) < req.count:
            continue
        key = (len(fitting), node)
        if best is None or key < best[0]:
            best = key, node, tuple(i for _, i in fitting[:req.count])
    return None if best is None else Placement(now, best[1], best[2])


def _earliest(now: float, req: Request, profile: dict[int, list[tuple[float, int]]]) -> Placement | None:
    best = None
    for node, entries in profile.items():
        if len(entries) < req.count:
            continue
        start = entries[req.count - 1][0]
        if best is None or (start, node) < best[:2]:
            best = start, node
    if best is None:
        return None
    start, node = best
    return Placement(max(start, now), node, tuple(sorted(i for _, i in profile[node][:req.count])))
