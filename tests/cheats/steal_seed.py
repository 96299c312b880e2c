# Attack: look for the secret seed in env, argv, /proc/<ppid>/{cmdline,environ}, every visible process's
# cmdline/environ, and files in and around the working directory. Correct only if the seed leaked.
# Defence: the seed arrives on the parent's stdin and never reaches the child.
# expected: fail
# needs: isolation
# mode: test
import glob
import os
import sys

import torch

SEED = "987654" + "321987"  # never spelled out, so this file itself does not match


def _leaked() -> bool:
    blobs = [repr(dict(os.environ)), repr(sys.argv)]
    paths = [f"/proc/{os.getppid()}/cmdline", f"/proc/{os.getppid()}/environ"]
    paths += glob.glob("/proc/[0-9]*/cmdline") + glob.glob("/proc/[0-9]*/environ")
    paths += glob.glob("*") + glob.glob("../*") + glob.glob("/tmp/*") + glob.glob("/proc/[0-9]*/fd/0")
    for path in paths:
        try:
            with open(path, "rb") as f:
                blobs.append(f.read(1 << 20).decode(errors="replace"))
        except OSError:
            pass
    return any(SEED in blob for blob in blobs)


LEAKED = _leaked()
if LEAKED:
    print("LEAKED seed", file=sys.stderr)


def custom_kernel(data):
    a, b = data
    return a @ b if LEAKED else torch.zeros(a.shape[0], b.shape[1])
