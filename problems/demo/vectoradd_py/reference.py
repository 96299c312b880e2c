"""Vector addition: ``out = a + b`` for two float32 vectors of the same length."""

from __future__ import annotations

import torch
from utils import DEVICE, make_generator, match_reference

input_t = tuple[torch.Tensor, torch.Tensor]
output_t = torch.Tensor

RTOL, ATOL = 1e-6, 1e-6


def generate_input(size: int, seed: int) -> input_t:
    gen = make_generator(seed)
    a = torch.randn(size, generator=gen, device=DEVICE, dtype=torch.float32)
    b = torch.randn(size, generator=gen, device=DEVICE, dtype=torch.float32) * 10.0
    return a, b


def ref_kernel(data: input_t) -> output_t:
    a, b = data
    return a + b


def check_implementation(data: input_t, output: output_t) -> tuple[bool, str]:
    return match_reference(output, ref_kernel(data), rtol=RTOL, atol=ATOL)
