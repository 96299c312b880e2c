# Attack: reach into the harness child's own module (sys.modules['__main__']) and replace the clock it
# captured, so every sample reads ~0 while the kernel secretly takes 10 ms.
# Defence: the parent compares the samples with the wall time it watched itself.
# expected: hacked
# mode: leaderboard
import sys
import time

_main = sys.modules["__main__"]
_fake = iter(range(0, 1 << 62, 1000))
if hasattr(_main, "_perf_ns"):
    _main._perf_ns = lambda: next(_fake)


def custom_kernel(data):
    a, b = data
    time.sleep(0.01)
    return a @ b
