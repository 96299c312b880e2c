"""The planner alone: FCFS, backfill into holes, later requests never delaying earlier ones."""

from runners.reservations.planner import Device, Request, plan


def devices(nodes: int, per_node: int, busy: dict[int, float] | None = None) -> list[Device]:
    busy = busy or {}
    return [Device(n * per_node + i, n, busy.get(n * per_node + i, 0.0)) for n in range(nodes) for i in range(per_node)]


def test_free_devices_start_now_on_one_node():
    placed = plan(100, devices(2, 4), [Request("a", 3, 60), Request("b", 3, 60)])
    assert placed["a"].start == placed["b"].start == 100
    assert placed["a"].node != placed["b"].node
    assert len(set(placed["a"].devices)) == 3


def test_queue_waits_for_the_earliest_node_and_fcfs_holds():
    busy = {i: 100 + 50 * i for i in range(4)}  # one node: devices free at 100, 150, 200, 250
    placed = plan(100, devices(1, 4, busy), [Request("big", 4, 100), Request("two", 2, 10)])
    assert placed["big"].start == 250
    # backfill: device 0 is free now and not needed before 250, but "two" needs 2 devices free now for 10 s: only one
    assert placed["two"].start == 350 or placed["two"].start == 150
    assert placed["two"].start + 10 <= placed["big"].start or placed["two"].start >= placed["big"].start + 100


def test_backfill_uses_holes_without_delaying_the_head():
    busy = {0: 0, 1: 0, 2: 500, 3: 500}
    placed = plan(0, devices(1, 4, busy), [Request("head", 4, 100), Request("short", 2, 400), Request("long", 2, 600)])
    assert placed["head"].start == 500
    assert placed["short"].start == 0 and set(placed["short"].devices) == {0, 1}
    assert placed["long"].start == 600  # would overlap the head in the hole: waits until after it


def test_adding_a_request_never_moves_earlier_ones():
    devs = devices(3, 8, {i: (i * 37) % 400 for i in range(24)})
    reqs = [Request(k, 1 + k % 8, 60 + 13 * k) for k in range(40)]
    before = plan(0, devs, reqs)
    after = plan(0, devs, [*reqs, Request("probe", 8, 10_000)])
    assert all(before[k] == after[k] for k in before)


def test_no_placement_overlaps_on_a_device():
    devs = devices(4, 8, {i: (i * 53) % 700 for i in range(32)})
    reqs = [Request(k, 1 + (k * 7) % 8, 30 + (k * 11) % 300) for k in range(200)]
    placed = plan(0, devs, reqs)
    spans: dict[int, list[tuple[float, float]]] = {}
    for r in reqs:
        p = placed[r.key]
        assert len(p.devices) == r.count and {d // 8 for d in p.devices} == {p.node}
        for d in p.devices:
            assert p.start >= devs[d].busy_until
            spans.setdefault(d, []).append((p.start, p.start + r.seconds))
    for items in spans.values():
        items.sort()
        assert all(a[1] <= b[0] for a, b in zip(items, items[1:], strict=False))


def test_too_many_for_any_node_is_none():
    assert plan(0, devices(2, 4), [Request("x", 5, 10)])["x"] is None
