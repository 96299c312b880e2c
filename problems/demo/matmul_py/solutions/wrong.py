import torch


def custom_kernel(data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    # Off by one in the reduction: the last term of every dot product is dropped.
    a, b = data
    k = a.shape[1]
    return a[:, : k - 1] @ b[: k - 1, :]
