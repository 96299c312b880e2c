"""A reservation holder's SSH login: the forced command of its authorized_keys line (node.key_lines), run as

    python -I hold.py GROUP        # GROUP: the reservation's cgroup directory, or "" where there is none

It puts itself in the reservation's cgroup, then becomes the login shell (or runs SSH_ORIGINAL_COMMAND): everything
the holder starts is in that group however it detaches or rewrites its environment (`setsid env -i …`), and the
node agent kills the group whole when the reservation ends. Where no group can be joined it forks a keeper that is a
child subreaper (orphans of the login are re-parented to it, not to init) and carries the reservation's tag, so the
agent finds the whole tree under it. That fallback holds only while the keeper lives: the holder runs as the agent's
account and could kill it, and its orphans would go to init; a cgroup has no such gap. Stdlib only: run by path, not
as part of the package.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_CHILD_SUBREAPER = 36


def shell() -> list[str]:
    command = os.environ.get("SSH_ORIGINAL_COMMAND", "")
    return ["bash", "-c", command] if command else ["bash", "-l"]


def join(group: str) -> bool:
    if not group:
        return False
    try:
        with open(os.path.join(group, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        return True
    except OSError:
        return False


def keep(argv: list[str]) -> int:
    """The login's exit status is its shell's; the keeper outlives it and reaps every orphan until none is left."""
    status_r, status_w = os.pipe()
    if os.fork():  # the login (sshd's child): waits for the shell's status only
        os.close(status_w)
        data = os.read(status_r, 16)
        return int(data) if data.strip().lstrip(b"-").isdigit() else 255
    os.close(status_r)
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    main_pid = os.fork()
    if main_pid == 0:
        for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        os.close(status_w)
        os.execvp(argv[0], argv)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the session's terminal or pipes stay the shell's only: the login ends with it
        os.dup2(null, fd)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(0)
        if pid == main_pid:
            os.write(status_w, str(os.waitstatus_to_exitcode(status) % 256).encode())
            os.close(status_w)


def main() -> int:
    argv = shell()
    if join(sys.argv[1] if len(sys.argv) > 1 else ""):
        os.execvp(argv[0], argv)
    return keep(argv)


if __name__ == "__main__":
    sys.exit(main())
