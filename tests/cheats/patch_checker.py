# Attack: patch torch.allclose/isclose/equal and plant fake `reference`/`utils` modules whose checker
# always passes, then return garbage.
# Defence: the checker runs in the trusted parent, on its own snapshot of the problem.
# expected: fail
# mode: test
import sys
import types

import torch

torch.allclose = lambda *a, **k: True
torch.isclose = lambda a, b, *args, **k: torch.ones_like(a, dtype=torch.bool)
torch.equal = lambda *a, **k: True
for name in ("reference", "utils"):
    fake = types.ModuleType(name)
    fake.check_implementation = lambda data, output: (True, "")
    fake.make_match_reference = lambda *a, **k: (lambda data, output: (True, ""))
    sys.modules[name] = fake


def custom_kernel(data):
    a, b = data
    return torch.zeros(a.shape[0], b.shape[1])
