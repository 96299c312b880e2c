"""Dense float32 matrix multiplication ``c = a @ b``."""

from __future__ import annotations

import torch
from utils import DEVICE, make_generator, match_reference

input_t = tuple[torch.Tensor, torch.Tensor]
output_t = torch.Tensor

RTOL, ATOL = 1e-4, 1e-3


def generate_input(m: int, k: int, n: int, seed: int) -> input_t:
    gen = make_generator(seed)
    a = torch.randn(m, k, generator=gen, device=DEVICE, dtype=torch.float32)
    b = torch.randn(k, n, generator=gen, device=DEVICE, dtype=torch.float32)
    return a, b


def ref_kernel(data: input_t) -> output_t:
    a, b = data
    return (a.double() @ b.double()).to(torch.float32)


def check_implementation(data: input_t, output: output_t) -> tuple[bool, str]:
    return match_reference(output, ref_kernel(data), rtol=RTOL, atol=ATOL)
