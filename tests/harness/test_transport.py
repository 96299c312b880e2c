"""Tensors between the trusted parent and the sandboxed child travel in shared buffers (child.py): memfds on the
CPU. These tests drive both ends of the real socket in one process; test_cheats/test_honest run them across the
sandbox."""

import os
import socket

import pytest
import torch

from runners.harness import child
from runners.harness.problem import clone


def pair():
    """(parent socket, child socket, the parent's pool, the child's imports)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    return a, b, child.Pool(torch, first_id=2), child.Imports(torch, writable=True)


def lend(obj, pool, a, b, imports, **extra):
    pool.send(a, {"op": "call", "id": 1, "data": child.encode(torch, obj, pool), **extra})
    header, fds = child.recv_message(b)
    imports.update(header, fds)
    while header["op"] == "buffers":
        header, fds = child.recv_message(b)
        imports.update(header, fds)
    return header, child.decode(torch, header["data"], imports.buffers)


def test_inputs_arrive_with_values_strides_aliasing_and_scalars():
    a, b, pool, imports = pair()
    base = torch.arange(24.0).view(4, 6)
    data = (base, base.t(), base[:, 1::2], {"n": 3, "eps": 1e-3, "name": "x", "none": None},
            [torch.tensor([True, False]), torch.zeros(0)], torch.int64, torch.device("cpu"))
    _, got = lend(data, pool, a, b, imports)
    assert torch.equal(got[0], base) and torch.equal(got[1], base.t()) and torch.equal(got[2], base[:, 1::2])
    assert got[1].stride() == (1, 6) and got[3] == {"n": 3, "eps": 1e-3, "name": "x", "none": None}
    assert torch.equal(got[4][0], torch.tensor([True, False])) and got[4][1].numel() == 0
    assert got[5] is torch.int64 and got[6] == torch.device("cpu")
    got[0][0, 0] = 100.0  # one storage: a write through one view shows in the others, as it would in eval.py
    assert got[1][0, 0] == 100.0 and base[0, 0] == 0.0  # and never in the parent's own tensor


def test_buffers_are_reused_and_replaced_when_too_small():
    a, b, pool, imports = pair()
    header, first = lend((torch.ones(1000),), pool, a, b, imports)
    assert len(header["new"]) == 1 and header["drop"] == []
    header, second = lend((torch.full((10,), 2.0),), pool, a, b, imports)
    assert header["new"] == [] and torch.equal(second[0], torch.full((10,), 2.0))
    old = pool.slots["cpu"][0].id
    header, third = lend((torch.full((1 << 20,), 3.0),), pool, a, b, imports)
    assert len(header["new"]) == 1 and header["drop"] == [old]
    assert list(imports.buffers) == [header["new"][0]["buf"]] and bool((third[0] == 3.0).all())
    assert torch.equal(first[0], torch.full((10,), 2.0).new_ones(1000).index_fill_(0, torch.arange(10), 2.0))


def test_more_descriptors_than_one_message_holds():
    a, b, pool, imports = pair()
    data = [torch.full((3,), float(i)) for i in range(child.MAX_FDS * 2 + 5)]
    _, got = lend(data, pool, a, b, imports)
    assert [float(t[0]) for t in got] == [float(i) for i in range(len(data))]


def test_outputs_come_back_as_the_parents_own_dense_copies():
    a, b, _, _ = pair()
    pool, imports = child.Pool(torch, first_id=1), child.Imports(torch, writable=False)
    out = torch.arange(12.0).view(3, 4).t()
    pool.send(b, {"op": "output", "id": 1, "out": child.encode(torch, out, pool, contiguous=True)})
    header, fds = child.recv_message(a)
    imports.update(header, fds)
    copy = child.decode(torch, header["out"], imports.buffers, copy=True)
    assert torch.equal(copy, out) and copy.is_contiguous()
    pool.slots["cpu"][0].u8.zero_()  # the child writes again: the parent's copy does not change
    assert torch.equal(copy, out)


def test_over_4_gib_crosses_without_a_frame_limit():
    """The pipe protocol broke at 4 GiB (a 32-bit frame length): a buffer has no such limit."""
    a, b, pool, imports = pair()
    big = torch.empty((4 << 30) + 4096, dtype=torch.uint8)
    big[0], big[-1], big[1 << 32] = 7, 9, 11
    _, got = lend((big,), pool, a, b, imports)
    assert (int(got[0][0]), int(got[0][-1]), int(got[0][1 << 32])) == (7, 9, 11)
    assert got[0].numel() == big.numel()


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        ({"T": [99, "float32", [2], None, 0]}, "unknown buffer"),
        ({"T": [2, "Tensor", [2], None, 0]}, "unknown dtype"),
        ({"T": [2, "float32", [1 << 40], None, 0]}, "does not fit"),
        ({"T": [2, "float32", [4], [1 << 40], 0]}, "does not fit"),
        ({"T": [2, "float32", [-1], None, 0]}, "bad shape"),
        ({"T": [2, "float32", [2], [1, 1], 0]}, "differ in length"),
        ({"object": "os.system"}, "bad structure"),
        ({"tuple": [{"tuple": []}] * 3, "x": 1}, "bad structure"),
    ],
)
def test_malformed_trees_are_protocol_errors(tree, message):
    a, b, pool, imports = pair()
    lend((torch.ones(4),), pool, a, b, imports)
    with pytest.raises(child.ProtocolError, match=message):
        child.decode(torch, tree, imports.buffers, copy=True)


def test_outputs_over_the_cap_are_refused():
    a, b, pool, imports = pair()
    lend((torch.ones(1 << 16),), pool, a, b, imports)
    with pytest.raises(child.ProtocolError, match="more than 1024 bytes"):
        child.decode(torch, {"T": [2, "float32", [1 << 16], None, 0]}, imports.buffers, copy=True, max_bytes=1024)


def test_a_resizable_or_foreign_descriptor_is_refused():
    """A child could otherwise shrink the file under the parent's mapping (SIGBUS in the trusted process)."""
    imports = child.Imports(torch, writable=False)
    fd = os.memfd_create("unsealed", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, 4096)
    r, w = os.pipe()
    os.close(w)
    with pytest.raises(child.ProtocolError, match="not a sealed"):
        imports.update({"new": [{"buf": 1, "kind": "cpu", "size": 4096}]}, [fd])
    with pytest.raises(child.ProtocolError, match="not a sealed"):
        imports.update({"new": [{"buf": 3, "kind": "cpu", "size": 4096}]}, [r])
    with pytest.raises(child.ProtocolError, match="do not match"):
        imports.update({"new": [{"buf": 5, "kind": "cpu", "size": 4096}]}, [])
    assert imports.buffers == {}


def test_clone_keeps_pristine_data():
    data = (torch.ones(3), {"x": torch.zeros(2)}, 5)
    copy = clone(data)
    copy[0].add_(1)
    copy[1]["x"].add_(1)
    assert torch.equal(data[0], torch.ones(3)) and torch.equal(data[1]["x"], torch.zeros(2))
