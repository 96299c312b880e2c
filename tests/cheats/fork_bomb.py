# Attack: fork until the machine runs out of processes (bounded here to 400 so a broken sandbox cannot
# take the test machine down), then hang.
# Defence: the sandbox's process limit, the timeout, and killing the whole tree.
# expected: fail|crash|timeout
# needs: isolation
# mode: test
import os
import time


def custom_kernel(data):
    for _ in range(400):
        try:
            if os.fork() == 0:
                time.sleep(120)
                os._exit(0)
        except OSError:
            break
    time.sleep(120)
