"""Warm harness parents: a template process imports torch and the harness once; each run's trusted parent is forked
from it, so starting one costs a fork instead of an interpreter and a torch import.

    python -m runners.harness.warm FD        (started by `Template`, never by hand)

The template never runs a job: every parent is forked from the same clean state. Requests come on the SEQPACKET socket
FD as JSON with the child's stdin, stdout and stderr attached (SCM_RIGHTS): {"env", "cwd", "spare"}; the template
forks a parent that takes those descriptors and runs `runners.harness.__main__.main` in its own process group,
answers {"pid"} and later {"exit", "code"}. It dies with its client (the socket closes, and PDEATHSIG), and each
parent dies with it. The client side (`Template`, `Forked`) is stdlib only: the node agent runs it under any
interpreter, and the template runs under the harness's (`--python`), so nothing is pickled between them.

multiprocessing's forkserver does the forking part, but it pickles between client and server (which may be different
Python versions here) and its children cannot take a run's own stdin/stdout/stderr, process group and environment;
this is the small part of it the harness needs.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

PR_SET_PDEATHSIG = 1
MESSAGE = 1 << 16
# the template stays single-threaded: these libraries would otherwise start thread pools on import (not fork-safe)
QUIET_THREADS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
PRELOAD = ("runners.harness.__main__", "runners.harness.kernelbot", "runners.harness.popcorn", "runners.harness.cuda")


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


# -- the template (server) -------------------------------------------------------------------------------------------

def serve(fd: int) -> int:
    import importlib

    for name in PRELOAD:
        with contextlib.suppress(Exception):  # a module that cannot import fails its run the same way, cold
            importlib.import_module(name)
    sock = socket.socket(fileno=fd)
    sock.sendall(json.dumps({"ready": os.getpid()}).encode())
    while True:
        _reap(sock)
        if not select.select([sock], [], [], 0.05)[0]:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, MESSAGE, 3)
        except OSError:
            return 0
        if not data:
            return 0  # the client is gone; our parents die with us
        request = json.loads(data)
        template_pid, pid = os.getpid(), os.fork()
        if pid == 0:
            sock.close()
            os._exit(_parent(request, fds, template_pid))
        with contextlib.suppress(OSError):  # its own process group before anyone can signal it (the child does too)
            os.setpgid(pid, pid)
        for descriptor in fds:
            os.close(descriptor)
        sock.sendall(json.dumps({"req": request["req"], "pid": pid}).encode())


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.sendall(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode())


def _parent(request: dict, fds: list[int], template_pid: int) -> int:
    """In the forked parent: become `python -m runners.harness` with this run's descriptors, session and env."""
    code = 1
    try:
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)
        _die_with_parent()
        if os.getppid() != template_pid:  # the template died before PDEATHSIG was set
            return 1
        for target, descriptor in enumerate(fds):
            os.dup2(descriptor, target)
            os.close(descriptor)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        from runners.harness.__main__ import main

        code = main(spare=request.get("spare"))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    return code


# -- the client ------------------------------------------------------------------------------------------------------

class Forked:
    """A harness parent forked by the template, with what run_harness needs of a Popen."""

    def __init__(self, stdin, stdout, stderr):
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.pid = 0
        self.returncode: int | None = None
        self._started, self._exited = threading.Event(), threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired("harness parent", timeout or 0)
        return self.returncode

    def kill(self) -> None:
        """SIGKILL its process group (the parent and its helpers; the sandbox dies with the parent)."""
        if self.pid and not self._exited.is_set():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)

    def _ended(self, code: int) -> None:
        self.returncode = code
        self._exited.set()


class Template:
    """One template process for an interpreter and a source tree, started in the background; `spawn` forks a harness
    parent from it (starting a new template first if the last one died)."""

    def __init__(self, python: str, pythonpath: str):
        self.python, self.pythonpath = python, pythonpath
        self.lock = threading.Lock()
        self.ids = itertools.count(1)
        self.sock: socket.socket | None = None
        self.proc: subprocess.Popen | None = None
        self.ready = threading.Event()
        self.pending: dict[int, Forked] = {}  # request id → parent not yet given a pid
        self.live: dict[int, Forked] = {}  # pid → parent not yet exited
        self.alive = False
        self._start()

    def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock, self.ready, self.alive = ours, threading.Event(), True
        # the template must die with this process: PDEATHSIG follows the thread that forked it, so a thread that
        # lives as long as the template starts it and then reads its messages
        threading.Thread(target=self._run, args=(ours, theirs), daemon=True, name="harness-template").start()

    def _run(self, ours: socket.socket, theirs: socket.socket) -> None:
        env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8", "PYTHONPATH": self.pythonpath,
               "PYTHONDONTWRITEBYTECODE": "1", **QUIET_THREADS}
        try:
            self.proc = subprocess.Popen([self.python, "-m", "runners.harness.warm", str(theirs.fileno())],
                                         cwd=self.pythonpath, env=env, pass_fds=(theirs.fileno(),),
                                         stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        except OSError:
            self._lost(ours)
            return
        finally:
            theirs.close()
        while True:
            try:
                data = ours.recv(MESSAGE)
            except OSError:
                data = b""
            if not data:
                break
            message = json.loads(data)
            if "ready" in message:
                self.ready.set()
            elif "pid" in message:
                with self.lock:
                    forked = self.pending.pop(message["req"])
                    forked.pid = message["pid"]
                    self.live[forked.pid] = forked
                forked._started.set()
            elif "exit" in message:
                with self.lock:
                    forked = self.live.pop(message["exit"], None)
                if forked is not None:
                    forked._ended(int(message["code"]))
        self._lost(ours)
        with contextlib.suppress(Exception):
            self.proc.kill()
            self.proc.wait()

    def _lost(self, sock: socket.socket) -> None:
        """The template is gone, and with it every parent it forked (PDEATHSIG): they ended killed."""
        with self.lock:
            if self.sock is sock:
                self.alive = False
            orphans = [*self.pending.values(), *self.live.values()] if self.sock is sock else []
            if self.sock is sock:
                self.pending, self.live = {}, {}
        for forked in orphans:
            forked._started.set()
            forked._ended(-signal.SIGKILL)
        self.ready.set()  # wake a spawn waiting for it; it sees `alive` false
        with contextlib.suppress(OSError):
            sock.close()

    def spawn(self, env: dict[str, str], cwd: str, spare: dict | None = None, timeout: float = 120.0) -> Forked:
        for _ in range(2):  # a template found dead is replaced once
            with self.lock:
                if not self.alive:
                    self._start()
                sock, ready = self.sock, self.ready
            if not ready.wait(timeout) or not self.alive:
                continue
            stdin_r, stdin_w = os.pipe()
            stdout_r, stdout_w = os.pipe()
            stderr_r, stderr_w = os.pipe()
            forked = Forked(os.fdopen(stdin_w, "wb"), os.fdopen(stdout_r, "rb"), os.fdopen(stderr_r, "rb"))
            req = next(self.ids)
            with self.lock:
                self.pending[req] = forked
            try:
                socket.send_fds(sock, [json.dumps({"req": req, "env": env, "cwd": cwd, "spare": spare}).encode()],
                                [stdin_r, stdout_w, stderr_w])
            except OSError:
                with self.lock:
                    self.pending.pop(req, None)
                for stream in (forked.stdin, forked.stdout, forked.stderr):
                    stream.close()
                continue
            finally:
                for descriptor in (stdin_r, stdout_w, stderr_w):
                    os.close(descriptor)
            forked._started.wait()
            if forked.pid:
                return forked
        raise RuntimeError(f"the harness template ({self.python} -m runners.harness.warm) is not running")

    def close(self) -> None:
        with self.lock:
            sock, self.alive = self.sock, False
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


_templates: dict[tuple[str, str], Template] = {}
_templates_lock = threading.Lock()


def template(python: str, pythonpath: str | Path) -> Template:
    """This process's template for `python` and the tree at `pythonpath` (started on first use)."""
    key = (python, str(pythonpath))
    with _templates_lock:
        if key not in _templates:
            _templates[key] = Template(*key)
        return _templates[key]


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
