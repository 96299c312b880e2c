# Honest: half the rows on a side stream, joined to the current stream before returning. All the work is inside the
# timed interval, so the work-outside-the-timed-stream defence must not refuse it.
# expected: pass
# mode: leaderboard
# problem: matmul_device
# needs: cuda
import torch

_side = []


def custom_kernel(data):
    a, b = data
    if not _side:
        _side.append(torch.cuda.Stream())
    side, current = _side[0], torch.cuda.current_stream()
    out = torch.empty(a.shape[0], b.shape[1], device=a.device)
    half = a.shape[0] // 2
    side.wait_stream(current)
    with torch.cuda.stream(side):
        torch.mm(a[:half], b, out=out[:half])
    torch.mm(a[half:], b, out=out[half:])
    current.wait_stream(side)  # joined: the end mark waits for the side stream's work
    return out
