# Attack: switch off the child's integrity checks (monkey-patch the harness child's Runner), return an
# empty tensor and fill it from a background thread that takes 20 ms.
# Defence: the parent checks every output it receives and compares samples with its own wall time.
# expected: fail|hacked
# mode: leaderboard
import sys
import threading
import time

import torch

_runner = getattr(sys.modules["__main__"], "Runner", None)
if _runner is not None:
    _runner.integrity = lambda *args, **kwargs: None
    _runner.threads = lambda *args, **kwargs: None


def custom_kernel(data):
    a, b = data
    out = torch.empty(a.shape[0], b.shape[1])

    def fill():
        time.sleep(0.02)
        torch.mm(a, b, out=out)

    threading.Thread(target=fill).start()
    return out
