# Attack: keep a worker thread alive that does work between/around the timed calls.
# Defence: timing is refused while the submission has threads of its own running.
# expected: hacked
# mode: leaderboard
import queue
import threading

_jobs = queue.Queue()
threading.Thread(target=lambda: [job() for job in iter(_jobs.get, None)], daemon=True).start()


def custom_kernel(data):
    a, b = data
    return a @ b
