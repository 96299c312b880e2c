"""The one planner: where and when each queued request starts. Pure (no Django), so the queue's start times, the ETA
`availability` shows, extension checks and the benchmark all call the same function.

Conservative backfilling. A request is given a start (its promise: devices of one node over [start, start +
duration)) when it is first planned, at the earliest time that fits around the holds and every promise already
given; so a newer request never delays an older one, and a short one may fill a hole now (backfill). Each later
pass keeps every promise that still fits and then compresses, in promise order: each request is taken out and put
back at the earliest time that fits, but only if that is earlier than its promise (its own slot is still free, so it
never moves later). An early end or a cancelled request frees room that the compression hands on; a new request
never moves anyone. A promise stops fitting only when the world breaks it (a device disabled, a run overrunning its
time limit, a hold extended past the promise): that request alone is planned again, after the kept ones.
Times are seconds (floats)."""

from __future__ import annotations

import math
from bisect import bisect_left
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
    count: int  # devices on each node
    seconds: float
    promise: float | None = None  # the start it was given, with the devices it was given them on
    devices: tuple[int, ...] = ()
    nodes: int = 1  # all or nothing: `count` devices on each of this many nodes, from one start


@dataclass(frozen=True)
class Placement:
    start: float
    node: int
    devices: tuple[int, ...]


class Schedule:
    """Per device, its busy intervals [start, end) sorted (a hold is one from -inf); per node, cached bounds."""

    def __init__(self, now: float, devices: Iterable[Device]):
        self.now = now
        self.starts: dict[int, list[float]] = {}
        self.ends: dict[int, list[float]] = {}
        self.node_of: dict[int, int] = {}
        self.nodes: dict[int, list[int]] = {}
        for d in devices:
            busy = d.busy_until > now
            self.starts[d.id] = [-math.inf] if busy else []
            self.ends[d.id] = [d.busy_until] if busy else []
            self.node_of[d.id] = d.node
            self.nodes.setdefault(d.node, []).append(d.id)
        self.cache: dict[int, tuple[list[tuple[float, int]], float]] = {}

    def free(self, dev: int, start: float, end: float) -> bool:
        i = bisect_left(self.starts[dev], end)
        return i == 0 or self.ends[dev][i - 1] <= start

    def fits(self, req: Request, start: float) -> bool:
        """The request's promised devices are still there, as many on each of its nodes, and free for it."""
        devs = req.devices
        if start < self.now or len(set(devs)) != len(devs) or len(devs) != req.count * req.nodes:
            return False
        if not all(d in self.node_of for d in devs):
            return False
        per_node: dict[int, int] = {}
        for d in devs:
            per_node[self.node_of[d]] = per_node.get(self.node_of[d], 0) + 1
        return (len(per_node) == req.nodes and set(per_node.values()) == {req.count}
                and all(self.free(d, start, start + req.seconds) for d in devs))

    def add(self, devs: Iterable[int], start: float, end: float) -> None:
        for d in devs:
            i = bisect_left(self.starts[d], start)
            self.starts[d].insert(i, start)
            self.ends[d].insert(i, end)
            self.cache.pop(self.node_of[d], None)

    def remove(self, devs: Iterable[int], start: float) -> None:
        for d in devs:
            i = bisect_left(self.starts[d], start)
            del self.starts[d][i], self.ends[d][i]
            self.cache.pop(self.node_of[d], None)

    def bounds(self, node: int) -> tuple[list[tuple[float, int]], list[float], list[float]]:
        """The node's devices by when they are free for good; its finite holes' starts (sorted) and the longest hole
        starting at or before each."""
        if node not in self.cache:
            tails, holes = [], []
            for d in self.nodes[node]:
                last = self.now
                for s, e in zip(self.starts[d], self.ends[d], strict=True):
                    if s > last:
                        holes.append((last, s - last))
                    last = e  # intervals are disjoint and sorted (a hold's ends after now)
                tails.append((last, d))
            tails.sort()
            holes.sort()
            longest, top = [], 0.0
            for _, length in holes:
                top = max(top, length)
                longest.append(top)
            self.cache[node] = tails, [h for h, _ in holes], longest
        return self.cache[node]

    def earliest(self, count: int, seconds: float, cap: float = math.inf) -> Placement | None:
        """The earliest placement before `cap` (the lowest node on ties), or None."""
        best: Placement | None = None
        limit = cap
        cache = self.cache
        for node in self.nodes:
            tails, hole_starts, longest = cache.get(node) or self.bounds(node)
            if len(tails) < count:
                continue
            bound = tails[count - 1][0]
            if bound < limit:
                limit = bound
                best = Placement(bound, node, tuple(sorted(d for _, d in tails[:count])))
            i = bisect_left(hole_starts, limit)  # holes starting before the best start so far
            if i and longest[i - 1] >= seconds:
                found = self._search(node, count, seconds, limit)
                if found is not None:
                    best, limit = found, found.start
        return best

    def _search(self, node: int, count: int, seconds: float, cap: float) -> Placement | None:
        """The earliest start before `cap` on one node: a sweep over each device's windows of possible starts (its
        holes at least `seconds` long, and its free tail)."""
        events = []  # (time, 0: a window opens / 1: closes, device, the window's end)
        for d in self.nodes[node]:
            last = self.now
            for s, e in zip(self.starts[d], self.ends[d], strict=True):
                if s - last >= seconds and last < cap:
                    events.append((last, 0, d, s))
                    events.append((s - seconds, 1, d, s))
                last = e
            if last < cap:
                events.append((last, 0, d, math.inf))
        events.sort()
        open_: dict[int, float] = {}
        for t, kind, d, end in events:
            if t >= cap:
                break
            if kind:
                open_.pop(d, None)
                continue
            open_[d] = end
            if len(open_) >= count:  # the tightest holes first
                chosen = sorted(open_, key=lambda x: (open_[x], x))[:count]
                return Placement(t, node, tuple(sorted(chosen)))
        return None

    def earliest_nodes(self, count: int, seconds: float, nodes: int, cap: float = math.inf) -> Placement | None:
        """The earliest start before `cap` at which `nodes` nodes each have `count` devices free for `seconds`: a scan
        of the times some device frees (requests over several nodes are few)."""
        times = sorted({self.now, *(e for ends in self.ends.values() for e in ends if self.now <= e < cap)})
        for t in times:
            chosen: list[int] = []
            found = 0
            for devs in self.nodes.values():
                free = [d for d in devs if self.free(d, t, t + seconds)]
                if len(free) >= count:
                    chosen.extend(sorted(free)[:count])
                    found += 1
                    if found == nodes:
                        return Placement(t, self.node_of[min(chosen)], tuple(sorted(chosen)))
        return None

    def place(self, req: Request, cap: float = math.inf) -> Placement | None:
        if req.nodes > 1:
            return self.earliest_nodes(req.count, req.seconds, req.nodes, cap)
        return self.earliest(req.count, req.seconds, cap)


def plan(now: float, devices: Iterable[Device], requests: Iterable[Request], *,
         compress: bool = True) -> dict[Hashable, Placement | None]:
    """Placement per request key (None when no node has that many devices). `requests` in queue order; those with a
    promise keep it or get an earlier one; the others are placed in order behind them."""
    schedule = Schedule(now, devices)
    reqs = list(requests)
    order = {r.key: i for i, r in enumerate(reqs)}
    placements: dict[Hashable, Placement | None] = {}
    promised = sorted((r for r in reqs if r.promise is not None and r.devices),
                      key=lambda r: (max(r.promise, now), order[r.key]))
    kept = []
    for r in promised:
        start = max(r.promise, now)
        if schedule.fits(r, start):
            schedule.add(r.devices, start, start + r.seconds)
            placements[r.key] = Placement(start, schedule.node_of[min(r.devices)], tuple(sorted(r.devices)))
            kept.append(r)
    if compress:
        for r in kept:
            old = placements[r.key]
            if old.start <= now:
                continue
            schedule.remove(old.devices, old.start)
            better = schedule.place(r, cap=old.start)
            if better is not None:
                placements[r.key] = better
            placed = placements[r.key]
            schedule.add(placed.devices, placed.start, placed.start + r.seconds)
    for r in reqs:
        if r.key in placements:
            continue
        placed = schedule.place(r)
        placements[r.key] = placed
        if placed is not None:
            schedule.add(placed.devices, placed.start, placed.start + r.seconds)
    return placements
