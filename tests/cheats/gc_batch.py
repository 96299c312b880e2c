# Attack: in the first call find every pre-generated input with gc.get_objects() and compute them all,
# then answer later calls from that batch by call order (the first call absorbs the others' work).
# Defence: the child only ever holds the current call's inputs; later calls get stale outputs.
# expected: fail
# mode: leaderboard
import gc

import torch

_outputs = []
_calls = 0


def custom_kernel(data):
    global _calls
    a, b = data
    if not _outputs:
        pairs = [o for o in gc.get_objects() if isinstance(o, tuple) and len(o) == 2
                 and all(isinstance(t, torch.Tensor) for t in o)]
        _outputs.extend(x @ y for x, y in pairs if x.shape == a.shape and y.shape == b.shape)
    out = _outputs[_calls % len(_outputs)] if _outputs else a @ b
    _calls += 1
    return out.clone()
