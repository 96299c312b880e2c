# Not an attack: a submission without custom_kernel. Must fail with a clear message.
# expected: fail
# mode: test
def kernel(data):
    return data[0] @ data[1]
