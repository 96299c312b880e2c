# Attack: be correct for the first few calls (the "tests") and skip the work once timing starts.
# Defence: every timed call's output is checked by the parent.
# expected: fail
# mode: leaderboard
import torch

_calls = 0


def custom_kernel(data):
    global _calls
    _calls += 1
    a, b = data
    return a @ b if _calls <= 4 else torch.empty(a.shape[0], b.shape[1])
