# Not an attack: a submission that does not import. Must fail with the import error as the message.
# expected: fail
# mode: test
import this_module_does_not_exist  # noqa: F401


def custom_kernel(data):
    return data[0]
