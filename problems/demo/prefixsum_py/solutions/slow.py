import torch


def custom_kernel(data: torch.Tensor) -> torch.Tensor:
    # Hillis-Steele scan: log2(n) full passes, O(n log n) work instead of O(n).
    out = data.clone()
    step = 1
    while step < out.numel():
        out = torch.cat((out[:step], out[step:] + out[:-step]))
        step *= 2
    return out
