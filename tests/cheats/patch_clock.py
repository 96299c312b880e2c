# Attack: patch time.perf_counter / perf_counter_ns / monotonic so the harness measures 1/1000 of the time.
# Defence: the child captured the clock before importing the submission, and reports the replacement.
# expected: hacked
# mode: leaderboard
import time

_real = {n: getattr(time, n) for n in ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns")}
time.perf_counter = lambda: _real["perf_counter"]() / 1000
time.perf_counter_ns = lambda: _real["perf_counter_ns"]() // 1000
time.monotonic = lambda: _real["monotonic"]() / 1000
time.monotonic_ns = lambda: _real["monotonic_ns"]() // 1000


def custom_kernel(data):
    a, b = data
    return a @ b
