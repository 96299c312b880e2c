# Honest, not an attack: the reference-kernels idiom for a preallocated output. The problem passes (a, b, out);
# the kernel writes the product into `out` and returns it, so the output shares storage with an input.
# Defence that must not misfire: the parent checks its own copy of the output, taken when the call returns,
# against the reference on its pristine inputs; sharing storage with an input is not a reason to reject.
# expected: pass
# problem: matmul_out
# mode: test
import torch


def custom_kernel(data):
    a, b, out = data
    torch.matmul(a, b, out=out)
    return out
