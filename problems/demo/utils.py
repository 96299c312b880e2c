"""Helpers shared by the demo problems; shipped next to each ``reference.py`` as ``utils.py``."""

from __future__ import annotations

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def make_generator(seed: int) -> torch.Generator:
    """A private RNG for input generation, so the global torch RNG is never touched."""
    gen = torch.Generator(device=DEVICE)
    gen.manual_seed(int(seed))
    return gen


def _index(flat: int, shape: torch.Size) -> str:
    coords = [int(c) for c in torch.unravel_index(torch.tensor(flat), shape)] if shape else []
    return "[" + ", ".join(map(str, coords)) + "]"


def match_reference(output: object, expected: torch.Tensor, *, rtol: float, atol: float) -> tuple[bool, str]:
    """Compare ``output`` with ``expected`` elementwise: ``|out - ref| <= atol + rtol * |ref|``.

    Returns ``(True, "")`` on success, else ``(False, message)`` naming the first problem found:
    type, shape, dtype or device mismatch, or the mismatch count, first mismatching index and
    maximum absolute error. NaN never matches. Neither argument is modified.
    """
    if not isinstance(output, torch.Tensor):
        return False, f"output must be a torch.Tensor, got {type(output).__name__}"
    if output.shape != expected.shape:
        return False, f"shape mismatch: expected {tuple(expected.shape)}, got {tuple(output.shape)}"
    if output.dtype != expected.dtype:
        return False, f"dtype mismatch: expected {expected.dtype}, got {output.dtype}"
    if output.device != expected.device:
        return False, f"device mismatch: expected {expected.device}, got {output.device}"
    got, ref = output.detach().double().reshape(-1), expected.detach().double().reshape(-1)
    err = (got - ref).abs()
    bad = ~(err <= atol + rtol * ref.abs())  # written this way so that NaN counts as bad
    n_bad = int(bad.sum())
    if n_bad == 0:
        return True, ""
    first = int(bad.nonzero()[0])
    worst = int(err.nan_to_num(nan=float("inf")).argmax())
    shape = expected.shape
    return False, (
        f"{n_bad} of {ref.numel()} elements differ beyond tolerance (rtol={rtol:g}, atol={atol:g}); "
        f"first mismatch at index {_index(first, shape)}: expected {ref[first].item():.7g}, "
        f"got {got[first].item():.7g}; max abs error {err[worst].item():.4g} at index {_index(worst, shape)}"
    )
