# Attack: search the heap (gc) for a tensor shaped like the output (e.g. a freed/cached reference output)
# and return it instead of computing.
# Defence: the child never holds reference outputs; the only candidates are wrong.
# expected: fail
# mode: test
import gc

import torch


def custom_kernel(data):
    a, b = data
    shape = (a.shape[0], b.shape[1])
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and tuple(obj.shape) == shape and obj is not a and obj is not b:
            return obj.clone()
    return torch.empty(shape)
