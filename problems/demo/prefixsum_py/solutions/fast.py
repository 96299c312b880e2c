import torch


def custom_kernel(data: torch.Tensor) -> torch.Tensor:
    # The builtin scan is a single linear pass (accumulating in double on CPU).
    return torch.cumsum(data, dim=0)
