import torch


def custom_kernel(data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    # One vectorised, multi-threaded pass over memory.
    a, b = data
    out = torch.empty_like(a)
    return torch.add(a, b, out=out)
