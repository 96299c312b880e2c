# Attack: inspect the call stack; when called from the harness's timing code, return garbage.
# Defence: every timed call's output is checked by the parent.
# expected: fail
# mode: leaderboard
import inspect

import torch


def custom_kernel(data):
    a, b = data
    timed = any("time" in f.function for f in inspect.stack()[1:])
    return torch.empty(a.shape[0], b.shape[1]) if timed else a @ b
