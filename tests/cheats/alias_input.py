# Attack: zero the inputs in place and return an alias of one as the output, so a checker that recomputes the
# reference from the inputs it handed over (or trusts memory the kernel can still change) sees agreement.
# Defence: the parent computes the reference on its pristine copy and checks its own copy of the output,
# taken when the call returns. Sharing storage with an input is allowed (preallocated outputs do), so only
# the values decide.
# expected: fail
# mode: test
def custom_kernel(data):
    a, b = data
    m, n = a.shape[0], b.shape[1]
    a.zero_()
    b.zero_()
    source = a if a.numel() >= m * n else b
    return source.view(-1)[: m * n].view(m, n) if source.numel() >= m * n else a
