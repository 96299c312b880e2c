# Attack: overwrite reference.py/utils.py in the working directory so that the checker accepts anything.
# Defence: the parent imported its own private snapshot of the problem before the child started.
# expected: fail
# mode: test
import os

import torch

for name in ("reference.py", "utils.py"):
    try:
        with open(name, "a") as f:
            f.write("\ncheck_implementation = lambda data, output: (True, '')\n")
        os.utime(name)
    except OSError:
        pass


def custom_kernel(data):
    a, b = data
    return torch.zeros(a.shape[0], b.shape[1])
