# Attack: return a lazy torch.Tensor subclass whose values are computed only when someone looks at them.
# Defence: only plain torch.Tensor outputs are accepted (child check, and weights_only load in the parent).
# expected: fail
# mode: test
import torch


class Lazy(torch.Tensor):
    pass


def custom_kernel(data):
    a, b = data
    return torch.zeros(a.shape[0], b.shape[1]).as_subclass(Lazy)
