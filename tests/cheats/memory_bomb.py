# Attack: allocate and touch memory step by step, each step far below the per-process limit, until the host
# runs short (bounded here to 6 GiB so a broken sandbox cannot take the test machine down), then answer
# correctly as if nothing happened.
# Defence: the run's memory cgroup limits the whole process tree (the corpus runs with a 2 GiB limit); the
# kernel kills it at the limit and the harness reports a memory-limit verdict.
# expected: memory_limit
# needs: memory-cgroup
# mode: test
import torch

_hoard = []


def custom_kernel(data):
    a, b = data
    for _ in range(24):
        _hoard.append(torch.ones(64 << 20))  # 256 MiB, written
    return a @ b
