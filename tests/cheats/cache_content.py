# Attack: cache outputs by (cheap) content fingerprint, hoping timed calls repeat the checked inputs.
# Defence: fresh random inputs per call; a cheap fingerprint collides and returns a stale output.
# expected: fail
# mode: leaderboard
_cache = {}


def custom_kernel(data):
    a, b = data
    key = (tuple(a.shape), tuple(b.shape), round(float(a[0, 0])), round(float(b[0, 0])))
    if key not in _cache:
        _cache[key] = a @ b
    return _cache[key].clone()
