# Attack: cache outputs by input pointer (data_ptr), hoping the harness reuses the same input buffers.
# Defence: fresh inputs for every call, every output checked; reused addresses return stale results.
# expected: fail
# mode: leaderboard
import torch

_cache = {}


def custom_kernel(data):
    a, b = data
    key = (a.data_ptr(), b.data_ptr(), a.shape, b.shape)
    if key not in _cache:
        _cache[key] = a @ b
    return _cache[key].clone()
