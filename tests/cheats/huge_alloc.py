# Attack: allocate (and touch) far more memory than the machine has.
# Defence: the sandbox's address-space limit turns it into an allocation error.
# expected: fail|crash
# needs: isolation
# mode: test
import torch


def custom_kernel(data):
    return torch.ones(1 << 40)
