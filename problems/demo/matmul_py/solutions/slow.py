import torch


def custom_kernel(data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    # Correct but slow: one matrix-vector product per output row, so b is streamed m times.
    a, b = data
    out = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
    for i in range(a.shape[0]):
        out[i] = a[i] @ b
    return out
