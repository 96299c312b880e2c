import torch


def custom_kernel(data: torch.Tensor) -> torch.Tensor:
    # The fused builtin: one pass for the max, one for exp+sum, one to normalise.
    return torch.softmax(data, dim=-1)
