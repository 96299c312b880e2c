import torch


def custom_kernel(data: torch.Tensor) -> torch.Tensor:
    # Off by one: an exclusive scan (out[i] = x[0] + ... + x[i-1]) instead of an inclusive one.
    return torch.cumsum(data, dim=0) - data
