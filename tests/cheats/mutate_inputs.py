# Attack: zero the inputs in place so that "the reference on the inputs" equals the returned zeros.
# Defence: the reference runs on the parent's pristine copy, which the child never touches.
# expected: fail
# mode: test
import torch


def custom_kernel(data):
    a, b = data
    a.zero_()
    b.zero_()
    return torch.zeros(a.shape[0], b.shape[1])
