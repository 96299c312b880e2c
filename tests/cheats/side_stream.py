# Attack: queue the work on a stream of its own and return at once: the end mark on the current stream does not wait
# for it, and the synchronize before the output is copied makes the output right: its time is the launch alone.
# Defence: the yardstick marks when the whole device went idle after the end mark (a synchronize, then a mark): what
# is left on other streams is charged to the call, and a batch in which every call leaves work there is refused.
# expected: hacked
# mode: leaderboard
# problem: matmul_device
# needs: cuda
import torch

_side = []


def custom_kernel(data):
    a, b = data
    if not _side:
        _side.append(torch.cuda.Stream())
    out = torch.empty(a.shape[0], b.shape[1], device=a.device)
    _side[0].wait_stream(torch.cuda.current_stream())  # the inputs are ready: no race, the output is right
    with torch.cuda.stream(_side[0]):
        for _ in range(300):  # far more work than a launch and a synchronize's round trip
            torch.mm(a, b, out=out)
    return out
