import torch


def custom_kernel(data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    # Off-by-one: the loop bound "n - 1" leaves the last element as a copy of a.
    a, b = data
    out = a.clone()
    n = a.numel()
    out[: n - 1] += b[: n - 1]
    return out
