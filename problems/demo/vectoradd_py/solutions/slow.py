import torch

CHUNK = 2048


def custom_kernel(data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    # Correct but slow: a Python loop launches one tiny add per chunk.
    a, b = data
    out = torch.empty_like(a)
    for start in range(0, a.numel(), CHUNK):
        stop = start + CHUNK
        out[start:stop] = a[start:stop] + b[start:stop]
    return out
