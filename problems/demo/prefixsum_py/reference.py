"""Inclusive prefix sum (scan) of a float32 vector."""

from __future__ import annotations

import torch
from utils import DEVICE, make_generator, match_reference

input_t = torch.Tensor
output_t = torch.Tensor

RTOL = 1e-5


def atol_for(size: int) -> float:
    # A sequential float32 scan drifts by roughly eps * size; allow twice that, plus a floor.
    return 1e-5 + 2e-7 * size


def generate_input(size: int, seed: int) -> input_t:
    gen = make_generator(seed)
    return torch.randn(size, generator=gen, device=DEVICE, dtype=torch.float32)


def ref_kernel(data: input_t) -> output_t:
    return torch.cumsum(data.double(), dim=0).to(torch.float32)


def check_implementation(data: input_t, output: output_t) -> tuple[bool, str]:
    return match_reference(output, ref_kernel(data), rtol=RTOL, atol=atol_for(data.numel()))
