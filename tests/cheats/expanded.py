# Attack: return an expanded (stride-0) tensor: a huge "output" backed by one row of memory.
# Defence: outputs with overlapping memory are rejected by the parent; values are checked anyway.
# expected: fail
# mode: test
def custom_kernel(data):
    a, b = data
    return (a[:1] @ b).expand(a.shape[0], b.shape[1])
