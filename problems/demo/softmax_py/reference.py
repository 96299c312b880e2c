"""Row-wise softmax of a float32 matrix with large per-row offsets."""

from __future__ import annotations

import torch
from utils import DEVICE, make_generator, match_reference

input_t = torch.Tensor
output_t = torch.Tensor

RTOL, ATOL = 1e-5, 1e-6


def generate_input(rows: int, cols: int, seed: int) -> input_t:
    gen = make_generator(seed)
    x = torch.randn(rows, cols, generator=gen, device=DEVICE, dtype=torch.float32) * 4.0
    # Every row gets its own offset in [-100, 100): a softmax without max-subtraction overflows.
    offset = torch.rand(rows, 1, generator=gen, device=DEVICE, dtype=torch.float32) * 200.0 - 100.0
    return (x + offset).contiguous()


def ref_kernel(data: input_t) -> output_t:
    return torch.softmax(data.double(), dim=-1).to(torch.float32)


def check_implementation(data: input_t, output: output_t) -> tuple[bool, str]:
    return match_reference(output, ref_kernel(data), rtol=RTOL, atol=ATOL)
