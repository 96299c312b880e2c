# Attack: never return (hang the runner).
# Defence: per-phase timeouts; the whole process tree is killed.
# expected: timeout
# mode: test
import time


def custom_kernel(data):
    while True:
        time.sleep(3600)
