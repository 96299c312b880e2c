# Attack: read the trusted parent's memory through /proc/<pid>/mem (maps + mem) to find the secret seed.
# Defence: separate pid namespace and uid, PR_SET_DUMPABLE=0 in the parent.
# expected: fail
# needs: isolation
# mode: test
import glob
import os
import re
import sys

import torch

SEED = b"987654" + b"321987"


def _scan(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
            for line in maps:
                m = re.match(r"([0-9a-f]+)-([0-9a-f]+) r", line)
                if not m:
                    continue
                start, end = int(m.group(1), 16), int(m.group(2), 16)
                if end - start > 1 << 28:
                    continue
                try:
                    mem.seek(start)
                    if SEED in mem.read(end - start):
                        return True
                except (OSError, ValueError, OverflowError):
                    pass
    except OSError:
        pass
    return False


pids = {str(os.getppid())} | {p.split("/")[2] for p in glob.glob("/proc/[0-9]*")}
LEAKED = any(_scan(pid) for pid in pids if pid != str(os.getpid()))
if LEAKED:
    print("LEAKED seed from parent memory", file=sys.stderr)


def custom_kernel(data):
    a, b = data
    return a @ b if LEAKED else torch.zeros(a.shape[0], b.shape[1])
