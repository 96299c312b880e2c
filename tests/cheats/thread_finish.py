# Attack: return an empty tensor at once and fill it in from a background thread after the timer stops.
# Defence: the parent checks its own copy of the output, taken when the call returns (the thread has not
# written it yet: wrong output); a thread that does run during a timed call gets timing refused, and the
# parent's wall time would expose the hidden work.
# expected: fail|hacked
# mode: leaderboard
import threading
import time

import torch


def custom_kernel(data):
    a, b = data
    out = torch.empty(a.shape[0], b.shape[1])

    def fill():
        time.sleep(0.005)
        torch.mm(a, b, out=out)

    threading.Thread(target=fill).start()
    return out
