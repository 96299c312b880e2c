"""Pool health check: out = a + b on the runner's device (CUDA/ROCm when torch sees one, else the CPU)."""

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def generate_input(size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device=DEVICE)
    gen.manual_seed(int(seed))
    return (torch.randn(size, generator=gen, device=DEVICE), torch.randn(size, generator=gen, device=DEVICE))


def ref_kernel(data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    a, b = data
    return a + b


def check_implementation(data: tuple[torch.Tensor, torch.Tensor], output: torch.Tensor) -> tuple[bool, str]:
    expected = ref_kernel(data)
    if not isinstance(output, torch.Tensor) or output.shape != expected.shape or output.device != expected.device:
        return False, "output is not a tensor of the input's shape on the input's device"
    if not torch.allclose(output, expected, rtol=1e-6, atol=1e-6):
        return False, "output differs from a + b"
    return True, ""
