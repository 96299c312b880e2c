# Attack: write the result into an input's storage and return that alias (the checker would see the
# mutated input as "the input" in an in-process harness).
# Defence: outputs sharing storage with inputs are rejected; the reference uses a pristine copy anyway.
# expected: fail
# mode: test
import torch


def custom_kernel(data):
    a, b = data
    result = a @ b
    flat = a.view(-1)
    if flat.numel() >= result.numel():
        flat[: result.numel()] = result.view(-1)
        return flat[: result.numel()].view(result.shape)
    return torch.zeros(1).expand(result.shape)
