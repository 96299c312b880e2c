# Attack: a worker thread started at import does each call's work while custom_kernel waits for it, so the
# work runs on a thread other than the one the harness times (a pattern that also hides work after the clock
# stops).
# Defence: timing is refused when threads other than the timed one use CPU during a timed call (read by the
# child per call and by the parent, from outside, per batch); idle threads (a library's compiler workers)
# are fine.
# expected: hacked
# mode: leaderboard
import queue
import threading

_jobs: queue.Queue = queue.Queue()
_done: queue.Queue = queue.Queue()


def _work():
    for a, b in iter(_jobs.get, None):
        out = a @ b
        # well past the 1 ms of other threads' CPU a timed call may have (library threads waking): 20 products of
        # the test cases' small matrices took ~1.1 ms on a quiet 2-core machine and passed about half the time
        for _ in range(400):
            out = (a @ b) + 0 * out
        _done.put(out)


threading.Thread(target=_work, daemon=True).start()


def custom_kernel(data):
    a, b = data
    _jobs.put((a, b))
    return _done.get()
