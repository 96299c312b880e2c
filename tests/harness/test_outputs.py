import io

import pytest
import torch

from runners.harness.problem import OutputError, clone, load_output, serialize


class Sub(torch.Tensor):
    pass


@pytest.mark.parametrize(
    "output",
    [torch.arange(6.0).view(2, 3), torch.arange(6.0).view(2, 3).t(), torch.arange(12.0)[::2], torch.zeros(0)],
    ids=["contiguous", "transposed", "strided-view", "empty"],
)
def test_plain_tensors_accepted(output):
    assert torch.equal(load_output(serialize(output), False), output)


def test_tuples_accepted_when_the_reference_returns_one():
    a, b = load_output(serialize((torch.ones(2), torch.zeros(3))), True)
    assert a.shape == (2,) and b.shape == (3,)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (serialize(torch.zeros(3).as_subclass(Sub)), "plain tensors"),
        (serialize(torch.zeros(1).expand(5)), "overlapping"),
        (serialize(torch.zeros(2, 3).to_sparse()), "dense strided"),
        (serialize([1, 2, 3]), "plain torch.Tensor"),
        (serialize((torch.ones(2), "x")), "plain torch.Tensor"),
        (b"not a torch file", "could not be decoded"),
    ],
    ids=["subclass", "expanded", "sparse", "list-of-ints", "tuple-with-str", "garbage"],
)
def test_bad_outputs_rejected(payload, message):
    with pytest.raises(OutputError, match=message):
        load_output(payload, True)


def test_weights_only_blocks_code_execution(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    buf = io.BytesIO()
    torch.save(Evil(), buf)
    with pytest.raises(OutputError):
        load_output(buf.getvalue(), False)
    assert not marker.exists()


def test_clone_keeps_pristine_data():
    data = (torch.ones(3), {"x": torch.zeros(2)}, 5)
    copy = clone(data)
    copy[0].add_(1)
    copy[1]["x"].add_(1)
    assert torch.equal(data[0], torch.ones(3)) and torch.equal(data[1]["x"], torch.zeros(2))
