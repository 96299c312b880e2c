"""The kernelbot protocol: a trusted parent (this module) and an untrusted child (`child.py`, sandboxed).

The parent owns the secret seed, generates every input from per-call seeds the child never learns, keeps
the pristine inputs, runs the reference checker on every output (timed calls included), computes the
statistics and decides the verdict. The child only ever holds the inputs of the call at hand.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import select
import shutil
import signal
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from . import child as child_module
from . import device, stats
from .job import Case, Job
from .problem import Problem, ProblemError, backend_flags, derive_seed, format_spec, scratch_dir
from .result import CaseResult, Emitter, Result, tail
from .sandbox import Outcome, Sandbox

CHILD_SCRIPT = "_harness_child.py"
MIN_OUTPUT_CAP = 64 << 20  # bytes of output a call may return: this or 8 times its inputs
MAX_OUTPUT_BUFFERS = 1024
PROFILE_CALLS = 5
CALIBRATION_ROUNDS = 5
LATE_CALIBRATION_CALLS = 20
LATE_SLACK, LATE_SLACK_NS = 2, 10_000  # how late a device may idle after a call's end mark (see calibrate_late)
BATCH_S = 0.03  # target duration of one side of an interleaved batch: short against the host's speed drifting
BATCH_CALLS = (4, 10)  # calls per batch, at least and at most
FREEZE_WAIT_S = 0.5
PLAUSIBILITY_TRIES = 2  # timings of a case whose wall time the samples do not explain before it is a verdict
CUDA_EVENT_RESOLUTION_NS = 500  # cudaEventElapsedTime's resolution, "around 0.5 microseconds" (CUDA runtime API)
PERF_COUNTER_RESOLUTION_NS = time.get_clock_info("perf_counter").resolution * 1e9
OOM_SETTLE_TRIES, OOM_SETTLE_S = 20, 0.1  # reads of the device's use after the child's end, until it settles
STOPPED_STATES = (b"T", b"t", b"Z", b"X", b"x", b"D")  # /proc states that run no user code (D: until it stops)


class Stop(Exception):
    """Ends the run with a verdict (the submission's fault, not the harness's)."""

    def __init__(self, verdict: str, message: str):
        super().__init__(message)
        self.verdict, self.message = verdict, message


class OutOfMemory(Exception):
    """The submission ran out of device memory and it was not its fault (others held it) or nobody can say."""

    def __init__(self, judged: device.Blame, said: str):
        super().__init__(said)
        self.judged, self.said = judged, said


# glibc's malloc serves a large block from mmap (page faults and zeroing on every call that allocates its output)
# until the first such block is freed, then raises its thresholds for the rest of the process: whether a call pays
# that depends on the process's history, and a submission's child and the reference's differ in it. Both children
# start at the thresholds glibc would reach (its 64-bit maximum, 32 MiB, and twice that for trimming).
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(64 << 20)}


class ChildSession:
    """One sandboxed child process and the socket to it. Every read has a deadline; tensors travel in shared
    buffers (child.py), never as bytes on the socket."""

    reference: ReferenceSession | None = None  # the run's reference child: what it holds is the run's own

    def __init__(self, job: Job, *, spare: bool = False, reference: bool = False):
        """spare: started ahead of its job (its wall-time limit starts with `adopt`). reference: the problem's own
        reference child (`ReferenceSession`), sandboxed alike but out of the submission's reach."""
        self.job, self.prestarted = job, spare
        script = os.path.join(job.workdir, CHILD_SCRIPT)
        shutil.copyfile(child_module.__file__, script)
        os.chmod(script, 0o644)
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {"PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", **MALLOC_ENV}
        argv = [sys.executable, CHILD_SCRIPT, str(theirs.fileno())]
        self.sandbox = Sandbox(job.workdir, job.sandbox_limits(), devices=list(job.gpus) if job.gpus else None,
                               uid=job.sandbox_uid)
        if reference and not self.sandbox.bwrap:  # no pid namespace: the submission's uid could signal or trace it
            self.sandbox.uid = None
        self.description = self.sandbox.describe()
        try:
            self.proc = self.sandbox.start(argv, env=env, pass_fds=(theirs.fileno(),), clock=not spare)
        finally:
            theirs.close()
        self.tree = SandboxTree(self.proc.pid)
        self.lent = child_module.Pool(torch, first_id=2)  # the parent's buffers: each call's inputs
        self.outputs = child_module.Imports(torch, writable=False, max_buffers=MAX_OUTPUT_BUFFERS)
        self.next_id = 0
        self.warmed = False  # the child was told to make its device context ahead of its job
        self.outcome: Outcome | None = None
        self.closed = False
        # wait() drains the child's stdout/stderr; run it alongside so a chatty child never blocks.
        self.waiter = threading.Thread(target=self._wait, daemon=True)
        self.waiter.start()

    @staticmethod
    def shape(job: Job) -> tuple:
        """What a sandboxed child is started with: a spare serves a job of the same shape."""
        return (job.workdir, job.gpus, job.sandbox_uid, dataclasses.replace(job.sandbox_limits(), wall_seconds=0))

    @classmethod
    def for_job(cls, job: Job) -> ChildSession:
        """The spare started ahead of this job when it is alive and of the job's shape, else a new child."""
        global _spare
        spare, _spare = _spare, None
        if spare is not None:
            if spare.proc.proc.poll() is None and cls.shape(spare.job) == cls.shape(job):
                spare.adopt(job)
                return spare
            spare.kill()
            spare.close(grace_s=1.0)
        return cls(job)

    def adopt(self, job: Job) -> None:
        """The job's files arrived in the workdir after the child started: they become the sandbox user's as a cold
        start's do, and the job's wall-time limit starts now."""
        self.job = job
        self.sandbox.prepare_workdir()
        self.proc.restart_clock(job.sandbox_limits())

    def _wait(self) -> None:
        self.outcome = self.proc.wait()

    def close(self, grace_s: float = 5.0) -> Outcome:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(Stop):
                self.send("exit", None, time.monotonic() + 1)
            self.sock.close()
        self.waiter.join(grace_s)
        if self.waiter.is_alive():
            self.proc.kill()
            self.waiter.join(grace_s)
        self.outputs.buffers.clear()
        if self.outcome is None:  # never block the result on a process tree that will not die
            return Outcome(None, "", "", False, "the sandbox did not reap the process tree after kill()")
        return self.outcome

    def kill(self) -> None:
        self.proc.kill()

    def lend(self, data: Any) -> Any:
        """The tree describing `data` once copied into the parent's shared buffers (not yet sent)."""
        return child_module.encode(torch, data, self.lent)

    def send(self, op: str, tree: Any, deadline: float, **extra: Any) -> int:
        self.next_id += 1
        left = deadline - time.monotonic()
        try:
            if left <= 0 or not select.select([], [self.sock], [], left)[1]:
                raise Stop("timeout", "")
            self.lent.send(self.sock, {"op": op, "id": self.next_id, "data": tree, **extra})
        except (BrokenPipeError, ConnectionError, OSError) as exc:
            if isinstance(exc, child_module.ProtocolError):
                raise
            raise Stop("crash", "") from None
        return self.next_id

    def recv(self, deadline: float) -> dict[str, Any]:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                raise Stop("timeout", "")
            try:
                header, fds = child_module.recv_message(self.sock)
                self.outputs.update(header, fds)
            except EOFError:
                raise Stop("crash", "") from None
            except child_module.ProtocolError as exc:
                raise Stop("hacked", f"protocol violation: {exc}") from None
            except OSError:
                raise Stop("crash", "") from None
            if header["op"] != "buffers":
                return header

    def expect(self, op: str, rid: int | None, deadline: float) -> dict[str, Any]:
        header = self.recv(deadline)
        if header["op"] == "error":
            kind, message = str(header.get("kind")), str(header.get("message", ""))[:4000]
            if kind in ("threads", "tamper"):
                raise Stop("hacked", message)
            prefix = {"import": "the submission could not be imported", "kernel": "custom_kernel raised",
                      "output": "invalid output"}.get(kind, "the submission failed")
            if kind in ("import", "kernel") and header.get("oom") is True and (judged := self.judge_oom(message)):
                if judged.who != "submission":
                    raise OutOfMemory(judged, message)
                prefix += f" (out of device memory: {judged.why})"
            raise Stop("fail", f"{prefix}: {message}")
        if header["op"] != op or header.get("id") != rid:
            raise Stop("hacked", f"protocol violation: expected {op!r} for call {rid}, got {header['op']!r}")
        return header

    def ready(self, deadline: float) -> None:
        """Wait for the child to answer: started, torch imported (so no later phase's clock counts that)."""
        self.expect("pong", self.send("ping", None, deadline), deadline)

    def measure(self) -> device.Memory | None:
        """The run's devices' memory now, per process from the driver's tool, else torch's device-wide figures."""
        if (memory := device.measure(list(self.job.gpus))) is None and torch.cuda.is_available():
            with contextlib.suppress(RuntimeError):
                return device.device_wide(*torch.cuda.mem_get_info())
        if memory is not None and self.reference is not None:
            memory = device.as_parents(memory, self.reference.proc.pid)
        return memory

    def judge_oom(self, message: str) -> device.Blame | None:
        """Whose fault the child's out-of-memory error is, from memory measured here; None on a node whose parent
        has no CUDA device, where no real one can happen (the child's claim, its own to make, is then ignored).
        The size torch's message gives is the child's to write too: it only narrows the case against others."""
        if not torch.cuda.is_available():
            return None
        return device.blame(self.memory_at_oom(), device.figures(message).asked, "submission")

    def memory_at_oom(self) -> device.Memory | None:
        """The run's devices' memory at an out-of-memory error, measured while the child lives. Where the driver
        does not say who held what (torch's device-wide figures, a container's pids this host cannot place), the
        device-wide use before and after the child is ended: what its end freed was its share (device.apportion)."""
        memory = self.measure()
        if memory is None or (memory.per_process and not memory.unplaced) or (before := self.used(memory)) is None:
            return memory
        reference = 0  # the reference child's share: the run's own, its child ended first
        if self.reference is not None:
            if (ended := self.reference.ended(memory)) is None:
                return memory
            reference, before = max(0, before - ended), ended
        if (after := self.ended(memory)) is None:
            return memory
        return device.apportion(memory, before, after, self.parent_use(), reference)

    def ended(self, memory: device.Memory) -> int | None:
        """Kill the child and wait for the device's use to settle; that use (None: unknown)."""
        self.kill()
        self.waiter.join(5)
        after = None
        for _ in range(OOM_SETTLE_TRIES):  # the driver frees a dead process's memory shortly after it is reaped
            previous, after = after, self.used(memory)
            if after is None or after == previous:
                break
            time.sleep(OOM_SETTLE_S)
        return None if self.waiter.is_alive() else after

    def used(self, memory: device.Memory) -> int | None:
        """Bytes in use on the run's devices as a whole now, from the source `memory` came from."""
        if memory.source != "torch":
            return device.used(list(self.job.gpus))
        with contextlib.suppress(RuntimeError):
            free, total = torch.cuda.mem_get_info()
            return total - free
        return None

    @staticmethod
    def parent_use() -> int:
        """What this process's torch holds on its devices (its CUDA context aside)."""
        if not torch.cuda.is_available():
            return 0
        return sum(torch.cuda.memory_reserved(i) for i in range(torch.cuda.device_count()))

    def output(self, rid: int, deadline: float, max_bytes: int) -> Any:
        """The parent's own copy of the output of call `rid`, taken the moment it is announced."""
        header = self.expect("output", rid, deadline)
        try:
            out = child_module.decode(torch, header.get("out"), self.outputs.buffers, copy=True, max_bytes=max_bytes)
        except child_module.ProtocolError as exc:
            raise Stop("hacked", f"protocol violation: {exc}") from None
        if not tensors_only(out):
            raise Stop("fail", "invalid output: custom_kernel must return a plain torch.Tensor or a tuple of them")
        return out


class ReferenceSession(ChildSession):
    """The problem's reference in a child of its own, started, fed, timed and read exactly as the submission's child
    is (the same child.py, sandbox, lent buffers and Yardstick), so that what happens around a call (the parent
    generating and checking between calls, a process woken to run it) is alike on both sides: a copy of the reference
    then scores 1.00x. It runs only the problem's files (a copy of the run's directory but the submission and links,
    where submission.py is
    `from reference import ref_kernel as custom_kernel`), the submission's tree is frozen while it is timed, and the
    submission cannot reach it (another pid namespace; without bubblewrap, this process's uid). What goes wrong in it
    is the problem's (ProblemError), never the submission's."""

    KERNEL = "from reference import ref_kernel as custom_kernel\n"

    def __init__(self, job: Job, *, spare: bool = False, files: str | None = None):
        """spare: started by a spare parent before its job, in an empty directory the job's files reach on `adopt`.
        files: where the problem's files are taken from (default: the run's directory)."""
        self.workdir = os.path.join(scratch_dir("kernelbot-reference-", job.workdir), "work")
        try:
            if spare:
                os.mkdir(self.workdir)
            else:
                self._copy_files(files or job.workdir)
            super().__init__(dataclasses.replace(job, workdir=self.workdir), spare=spare, reference=True)
        except BaseException:
            shutil.rmtree(os.path.dirname(self.workdir), ignore_errors=True)
            raise

    def _copy_files(self, source: str) -> None:
        """The problem's files but the submission and links, and the reference as the submission."""
        shutil.copytree(source, self.workdir, dirs_exist_ok=True, ignore=lambda at, names: [
            n for n in names if os.path.islink(os.path.join(at, n)) or (
                at == source and n in ("submission.py", CHILD_SCRIPT))])
        with open(os.path.join(self.workdir, "submission.py"), "w") as f:
            f.write(self.KERNEL)

    @classmethod
    def for_job(cls, job: Job, files: str) -> ReferenceSession:
        """The reference child a spare started ahead of this job when it is alive and of the job's shape, else a new
        one: a run then no longer waits for an interpreter and torch to start before its first timed phase. `files`:
        the problem's files as they were before the submission ran (`Problem.snapshot`), not the run's directory,
        which the submission's child may have written to since."""
        global _spare_reference
        spare, _spare_reference = _spare_reference, None
        if spare is not None:
            if spare.proc.proc.poll() is None and cls.shape(spare.job) == cls.shape(
                    dataclasses.replace(job, workdir=spare.workdir)):
                spare.adopt(job, files)
                return spare
            spare.kill()
            spare.close(grace_s=1.0)
        return cls(job, files=files)

    def adopt(self, job: Job, files: str | None = None) -> None:
        self._copy_files(files or job.workdir)
        super().adopt(dataclasses.replace(job, workdir=self.workdir))

    @contextlib.contextmanager
    def failing_as_problem(self, what: str):
        """A Stop of this child (it crashed, broke the protocol) is the problem's error; a timeout stays the phase's."""
        try:
            yield
        except Stop as stop:
            if stop.verdict == "timeout":
                raise
            outcome = self.close(grace_s=1.0) if stop.verdict == "crash" else None
            said = stop.message or (f"its process ended ({outcome.reason or f'exit code {outcome.returncode}'}): "
                                    f"{tail(outcome.stderr)}" if outcome else stop.verdict)
            raise ProblemError(what, RuntimeError(said)) from None

    def expect(self, op: str, rid: int | None, deadline: float) -> dict[str, Any]:
        header = self.recv(deadline)
        if header["op"] == "error":  # a trusted process: its word on an out-of-memory error is the driver's
            message = str(header.get("message", ""))[:4000]
            cause = torch.OutOfMemoryError(message) if header.get("oom") is True else RuntimeError(message)
            raise ProblemError(f"the reference ({header.get('kind')})", cause)
        if header["op"] != op or header.get("id") != rid:
            raise Stop("hacked", f"protocol violation: expected {op!r} for call {rid}, got {header['op']!r}")
        return header

    def close(self, grace_s: float = 5.0) -> Outcome:
        try:
            return super().close(grace_s)
        finally:
            shutil.rmtree(os.path.dirname(self.workdir), ignore_errors=True)


def tensors_only(out: Any) -> bool:
    if isinstance(out, torch.Tensor):
        return True
    return isinstance(out, tuple | list) and all(tensors_only(o) for o in out)


def nbytes(data: Any) -> int:
    if isinstance(data, torch.Tensor):
        return data.numel() * data.element_size()
    if isinstance(data, tuple | list):
        return sum(nbytes(d) for d in data)
    if isinstance(data, dict):
        return sum(nbytes(d) for d in data.values())
    return 0


def run_queue_wait_ns(schedstat: str) -> int:
    """The second field of a schedstat file: ns spent waiting on a run queue (0 where unavailable)."""
    try:
        with open(schedstat, "rb") as f:
            return int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0


class SandboxTree:
    """The sandbox's processes as the trusted parent sees them from /proc: the one it started and every
    descendant (under bubblewrap a setsid'd double fork still lives below the pid namespace's init)."""

    def __init__(self, root: int):
        self.root = root

    @staticmethod
    def _stat(pid: int) -> list[bytes]:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
        return raw[raw.rindex(b")") + 2:].split()  # [state, ppid, ...]: field 3 onwards

    def states(self) -> dict[int, bytes]:
        """pid -> state letter of the root and every descendant (one pass over /proc)."""
        children: dict[int, list[int]] = {}
        state: dict[int, bytes] = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    fields = self._stat(int(name))
                    children.setdefault(int(fields[1]), []).append(int(name))
                    state[int(name)] = fields[0]
        tree, todo = {}, [self.root]
        while todo:
            pid = todo.pop()
            tree[pid] = state.get(pid, b"X")
            todo.extend(children.get(pid, ()))
        return tree

    def leaf(self) -> int | None:
        """The newest process without children: the child interpreter, while no submission code has run."""
        tree = self.states()
        parents = set()
        for pid in tree:
            with contextlib.suppress(OSError, ValueError, IndexError):
                parents.add(int(self._stat(pid)[1]))
        leaves = [pid for pid in tree if pid not in parents]
        return max(leaves) if leaves else None

    @contextlib.contextmanager
    def frozen(self):
        """Every process of the sandbox stopped (SIGSTOP cannot be caught) for the block, so nothing the
        submission started can run, and compete with the parent, while the parent measures its yardstick.
        The process group is stopped at once; passes over /proc then stop every process of the tree not yet
        stopped (bubblewrap's --new-session and any setsid leave the group) until one pass finds them all
        stopped: a stopped process cannot fork, so the tree is then complete."""
        stopped: set[int] = set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.root, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + FREEZE_WAIT_S
            while True:
                running = [pid for pid, state in self.states().items() if state not in STOPPED_STATES]
                if not running or time.monotonic() > deadline:
                    break
                for pid in running:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGSTOP)
                    stopped.add(pid)
                time.sleep(0.0002)
            yield
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.root, signal.SIGCONT)
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)


_spare: ChildSession | None = None  # a spare parent's child, started before its job (runners.harness.warm)
_spare_reference: ReferenceSession | None = None  # and its reference child, where the job's mode times


def device_context() -> None:
    """This process's CUDA context on its device, made now (nothing without CUDA; at once when made already)."""
    if torch.cuda.is_available():
        torch.empty(1, device="cuda")
        torch.cuda.synchronize()


def prestart(job: Job, warm_device: bool = False) -> None:
    """A spare's child, started before its job. warm_device: the device is free (no reservation holds it), so the
    parent and the child make their device contexts now instead of in the run."""
    global _spare, _spare_reference
    _spare = ChildSession(job, spare=True)
    if job.mode in ("benchmark", "leaderboard"):
        _spare_reference = ReferenceSession(job, spare=True)
    if warm_device and torch.cuda.is_available():
        device_context()
        for session in filter(None, (_spare, _spare_reference)):
            with contextlib.suppress(Stop):
                session.send("warm", None, time.monotonic() + 5)
            session.warmed = True


def close_spare_reference() -> None:
    """A spare's reference child that its run did not take (it timed nothing, or its shape differed)."""
    global _spare_reference
    spare, _spare_reference = _spare_reference, None
    if spare is not None:
        spare.kill()
        spare.close(grace_s=1.0)


@dataclasses.dataclass
class Timing:
    samples: list[float]
    walls: list[float]
    batches: list[tuple[float, float, float, float]]
    reason: str
    waited: float  # ns the parent's and the child's main threads waited for a CPU meanwhile


def plausibly_timed(time_case: Callable[[], Timing], overhead: float,
                    tries: int = PLAUSIBILITY_TRIES) -> tuple[Timing | None, list[str]]:
    """Times a case until the wall time the parent watched explains its samples (stats.implausible), at most `tries`
    times: a burst of load on the host can leave wall time unexplained once, work a submission hides does every time.
    Returns (the plausible timing or None, why each earlier one was not)."""
    flagged: list[str] = []
    for _ in range(tries):
        timed = time_case()
        problem = stats.implausible(timed.samples, timed.walls, overhead, timed.waited)
        if problem is None:
            return timed, flagged
        flagged.append(problem)
    return None, flagged


class KernelbotRun:
    def __init__(self, job: Job, emitter: Emitter):
        self.job, self.emit = job, emitter
        self.result = Result(mode=job.mode, protocol="kernelbot")
        self.problem: Problem | None = None
        self.session: ChildSession | None = None
        self.phase = "test"
        self.deadline = 0.0
        self.overhead: dict[str, float] = {}  # case spec -> calibrated ns of moving one call's data
        self.waited = 0  # ns this thread and the child's main thread waited for a CPU inside timed calls
        self.child_pid: int | None = None  # the child interpreter's host pid, found before the import
        self.thread_ns = 0  # the most CPU the child's other threads used during one batch of timed calls
        self.seconds: dict[str, float] = {}  # where the run's time went (result "seconds"), phase by phase
        self.lent_s = 0.0  # of which copying inputs into the lent buffers (result "seconds_of", with the problem's)
        self.yardstick = child_module.Yardstick(torch)  # the parent's: calibrate_late's empty calls
        self.reference: ReferenceSession | None = None  # the reference's own child (timed modes)
        self.late_baseline, self.late_allowance = 0.0, math.inf  # ns (calibrate_late); without a GPU `late` is 0

    @contextlib.contextmanager
    def clock(self, name: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started

    # -- plumbing --------------------------------------------------------------------------------------
    def start_phase(self, phase: str) -> None:
        self.phase = phase
        self.deadline = time.monotonic() + self.job.timeout("test" if phase == "profile" else phase)

    def _output_cap(self, data: Any) -> int:
        return max(MIN_OUTPUT_CAP, 8 * nbytes(data))

    def lend(self, data: Any) -> Any:
        assert self.session is not None
        started = time.perf_counter()
        try:
            return self.session.lend(data)
        finally:
            self.lent_s += time.perf_counter() - started

    def call(self, data: Any) -> Any:
        assert self.session is not None
        tree = self.lend(data)
        rid = self.session.send("call", tree, self.deadline)
        return self.session.output(rid, self.deadline, self._output_cap(data))

    def timed_call(self, data: Any, session: ChildSession | None = None) -> tuple[int, int, Any, int]:
        """(reported ns, watched wall ns, output, reported late ns: see child.Yardstick) of a call by the submission's
        child, or the same way by `session` (the reference's). The wall covers sending the call to holding a copy of
        the output."""
        theirs = session is not None and session is not self.session
        session = session or self.session
        assert session is not None
        started = time.perf_counter()
        tree = session.lend(data)
        self.lent_s += time.perf_counter() - started
        cap = self._output_cap(data)
        waited = 0 if theirs else self.run_queue_waits()
        t0 = time.perf_counter_ns()
        rid = session.send("time", tree, self.deadline)
        header = session.expect("sample", rid, self.deadline)
        out = session.output(rid, self.deadline, cap)
        wall = time.perf_counter_ns() - t0
        if not theirs:
            self.waited += self.run_queue_waits() - waited
        ns, late = header.get("ns"), header.get("late", 0)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (ns, late)):
            raise Stop("hacked", "protocol violation: a sample that is not a non-negative integer")
        return ns, wall, out, late

    def run_queue_waits(self) -> int:
        """ns this thread and the child's main thread have waited for a CPU so far (kernel accounting)."""
        child = self.child_pid
        return run_queue_wait_ns("/proc/thread-self/schedstat") + (
            run_queue_wait_ns(f"/proc/{child}/task/{child}/schedstat") if child else 0)

    def other_threads(self) -> dict[int, int]:
        """CPU ns so far of every thread of the child interpreter but its main one, read from outside."""
        child = self.child_pid
        return child_module.thread_times(str(child), skip=child) if child else {}

    def checked(self, spec: str, data: Any, output: Any) -> None:
        assert self.problem is not None
        ok, message = self.problem.check(data, output)
        if not ok:
            raise Stop("fail", f"wrong output for {spec}: {message}")

    def calibrate(self, cases: tuple[Case, ...]) -> None:
        """Measure each timed case's data-movement cost through the child before the submission is
        imported: the allowance the plausibility check grants per call, which the submission can't inflate."""
        assert self.problem is not None and self.session is not None
        for case in cases:
            spec = format_spec(case)
            if spec in self.overhead:
                continue
            data = self.problem.generate(case, self.seed("calibrate", 0, 0, case))
            output = self.problem.reference(data)
            walls = []
            for _ in range(CALIBRATION_ROUNDS):
                tree = self.lend((data, output))
                t0 = time.perf_counter_ns()
                rid = self.session.send("echo", tree, self.deadline)
                self.session.output(rid, self.deadline, self._output_cap((data, output)))
                walls.append(time.perf_counter_ns() - t0)
            self.overhead[spec] = statistics.median(walls)
        self.child_pid = self.session.tree.leaf()

    # -- phases ------------------------------------------------------------------------------------------
    def seed(self, phase: str, i: int, k: int, case: Case) -> int:
        return derive_seed(self.job.seed, phase, i, k, case.get("seed"))

    def run_tests(self) -> None:
        assert self.problem is not None
        self.start_phase("test")
        tests = self.job.tests
        for i, case in enumerate(tests):
            spec = format_spec(case)
            data = self.problem.generate(case, self.seed("test", i, 0, case))
            output = self.call(data)
            ok, message = self.problem.check(data, output)
            self.result.tests.append(CaseResult(spec, "pass" if ok else "fail", message))
            if not ok:
                self.result.fail("fail", f"test {i} ({spec}) failed: {message}")
            self.emit.progress("test", i + 1, len(tests))

    def time_reference(self, case: Case, seed: int, calls: int) -> list[int]:
        """The yardstick: the problem's reference timed in its own child (ReferenceSession) exactly as the
        submission's calls are (`timed_call`: fresh inputs generated here and lent just before each call, the
        child's Yardstick, its output copied back and checked here), while the submission's sandbox is frozen
        (nothing of it runs meanwhile); each sample charged what the device stayed busy past the baseline
        (stats.charge_late), as the submission's are. Timed in this process instead, it ran up to 30 % faster than
        the same code in the child (bench/RESULTS.md, A/A): this process's core had just generated and checked, the
        child's had not. Load on the host that lasts longer than a batch slows both alike
        (tests/harness/test_host_load.py)."""
        assert self.problem is not None and self.session is not None and self.reference is not None
        samples, lates = [], []
        with self.session.tree.frozen(), self.reference.failing_as_problem("the reference's timed call"):
            for j in range(calls):
                data = self.problem.generate(case, derive_seed(seed, "reference", j, 0))
                ns, _, out, late = self.timed_call(data, self.reference)
                samples.append(ns)
                lates.append(late)
                self.problem.check(data, out)  # as the parent checks a submission's output
        return stats.charge_late(samples, lates, self.late_baseline)  # as the submission's samples are

    def calibrate_late(self) -> None:
        """On a GPU: how late after a call's end mark the device goes idle when all its work is on the call's
        stream (a synchronize's round trip), measured here on empty calls before the submission is imported: the
        baseline past which a call is charged, and (LATE_SLACK times it plus LATE_SLACK_NS) the allowance past which
        a batch is refused as work outside the timed stream (stats.outside_stream)."""
        if self.yardstick.cuda:
            late = [self.yardstick(lambda _: None, None)[2] for _ in range(LATE_CALIBRATION_CALLS)]
            self.late_baseline = stats.median(late)
            self.late_allowance = LATE_SLACK * self.late_baseline + LATE_SLACK_NS

    def run_timed(self, phase: str, cases: tuple[Case, ...]) -> list[CaseResult]:
        """Per case: warm up, then alternate batches of the submission's timed calls with batches of the
        reference's, until the ratio's interval is tight enough or the budget is spent. The reference's child is
        warmed up by as many calls as the submission's was: cold, its first batch ran up to 25 times slower than the
        rest on this machine (first batch ratios 0.04-0.5 of identical code against ~1), and a median of a few
        batches and its interval took that in (A/A medians ~5 % low on softmax)."""
        assert self.problem is not None and self.session is not None
        self.start_phase(phase)
        results: list[CaseResult] = []
        timing = self.job.timing
        for i, case in enumerate(cases):
            spec = format_spec(case)
            gen = self.problem.generate
            data = gen(case, self.seed(phase, i, 0, case))
            self.checked(spec, data, self.call(data))
            overhead = self.overhead[spec]
            k, t_end, warm = 1, time.monotonic() + timing.warmup_s, []
            while k == 1 or time.monotonic() < t_end:
                data = gen(case, self.seed(phase, i, k, case))
                t0 = time.perf_counter_ns()
                self.checked(spec, data, self.timed_call(data)[2])
                warm.append(time.perf_counter_ns() - t0)  # a call's full cost here: generate, run, check
                k += 1
            calls = self.batch_calls(stats.median(warm))  # the same on both sides: minima of equal counts
            self.time_reference(case, self.seed(phase, i, 0, case), len(warm))  # its warm-up: as many calls
            counter = [k]  # the next call's index, shared by the timings of this case
            timed, flagged = plausibly_timed(
                functools.partial(self.time_case, phase, i, case, calls, counter), overhead)
            if flagged:
                self.result.extra.setdefault("retimed", []).extend(f"{phase} {spec}: {f}" for f in flagged)
            if timed is None:
                raise Stop("hacked", f"{phase} {spec}: {flagged[-1]} (in each of {len(flagged)} timings)")
            samples, walls, batches, reason = timed.samples, timed.walls, timed.batches, timed.reason
            spread = math.hypot(timing.run_spread, self.resolution(batches))  # what more batches cannot shrink
            results.append(CaseResult(
                spec, "pass", "", stats.summarize(samples), reason, int(sum(walls)),
                time=stats.estimate([b[0] for b in batches], spread),
                reference=stats.estimate([b[1] for b in batches]),
                ratio=stats.estimate([b[0] / b[1] for b in batches], spread),
                batches=[[int(v) for v in b] for b in batches],
            ))
            self.emit.progress(phase, i + 1, len(cases))
        return results

    def start_reference(self) -> None:
        """The reference's own child, started when the first timed phase begins (not beside the tests, whose phase
        limit it would eat on a small machine), under that phase's limit."""
        assert self.session is not None
        self.start_phase("benchmark")
        assert self.problem is not None
        self.reference = self.session.reference = ReferenceSession.for_job(self.job, self.problem.snapshot)
        self.result.extra["reference_start"] = "prestarted" if self.reference.prestarted else "cold"
        with self.reference.failing_as_problem("the reference's process"):
            self.reference.send("import", None, self.deadline, flags=backend_flags())
            self.reference.expect("hello", None, self.deadline)

    def time_case(self, phase: str, i: int, case: Case, calls: int, counter: list[int]) -> Timing:
        """One timing of a case: batches of `calls` of the submission's timed calls alternating with the reference's,
        until the ratio's interval is tight enough or the budget is spent. `counter[0]`: the next call's index."""
        assert self.problem is not None
        timing, spec, gen = self.job.timing, format_spec(case), self.problem.generate
        samples: list[float] = []
        walls: list[float] = []
        batches: list[tuple[float, float, float, float]] = []  # minima and medians: submission, reference
        started, waited_before = time.monotonic(), self.waited
        reason = None
        while reason is None:
            batch, lates = [], []
            threads_before = self.other_threads()
            for _ in range(calls):
                data = gen(case, self.seed(phase, i, counter[0], case))
                ns, wall, output, late = self.timed_call(data)
                self.checked(spec, data, output)
                batch.append(ns)
                lates.append(late)
                walls.append(wall)
                counter[0] += 1
            used, _ = child_module.busy_threads(threads_before, self.other_threads())
            if used > child_module.THREAD_CPU_NS * calls:
                raise Stop("hacked", f"{phase} {spec}: threads of the submission other than the timed one ran for "
                           f"{used / 1e6:.1f} ms during {calls} timed calls (work outside the timed call)")
            self.thread_ns = max(self.thread_ns, used)
            batch, problem = stats.outside_stream(batch, lates, self.late_baseline, self.late_allowance)
            if problem:
                raise Stop("hacked", f"{phase} {spec}: {problem}")
            samples += batch
            reference = self.time_reference(case, self.seed(phase, i, counter[0], case), calls)
            batches.append((min(batch), min(reference), stats.median(batch), stats.median(reference)))
            reason = stats.batch_stop_reason(
                [b[0] / b[1] for b in batches], len(samples), time.monotonic() - started, rel_ci=timing.rel_ci,
                max_samples=timing.max_samples, budget_s=timing.case_budget_s, run_spread=timing.run_spread,
                resolution=self.resolution(batches),
            )
        return Timing(samples, walls, batches, reason, self.waited - waited_before)

    @staticmethod
    def resolution(batches: list[tuple[float, float, float, float]]) -> float:
        """The clock's resolution relative to the submission's time (its batch minima's median)."""
        tick = CUDA_EVENT_RESOLUTION_NS if torch.cuda.is_available() else PERF_COUNTER_RESOLUTION_NS
        return tick / max(stats.median([b[0] for b in batches]), 1.0) if batches else 0.0

    @staticmethod
    def batch_calls(call_ns: float) -> int:
        low, high = BATCH_CALLS
        return max(low, min(high, round(BATCH_S * 1e9 / max(call_ns, 1.0))))

    def run_profile(self) -> None:
        assert self.problem is not None and self.session is not None
        self.start_phase("profile")
        cases = self.job.benchmarks or self.job.tests
        if not cases:
            raise Stop("fail", "nothing to profile: the job has no benchmarks or tests")
        case = cases[-1]
        data = self.problem.generate(case, self.seed("profile", 0, 0, case))
        rid = self.session.send("profile", self.lend(data), self.deadline, calls=PROFILE_CALLS)
        header = self.session.expect("profile", rid, self.deadline)
        out = self.session.output(rid, self.deadline, self._output_cap(data))
        self.checked(format_spec(case), data, out)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.result.extra["profile"] = str(header.get("report", ""))[:64000]
        self.result.extra["profiler"] = (
            f"torch.profiler ({device}); report produced inside the sandbox, informational only"
            + ("" if device == "cuda" else "; no GPU profiler (nsys/ncu) is available on this machine")
        )
        self.result.flags.append(f"profile:torch-{device}")

    def run(self) -> Result:
        job = self.job
        result = self.result
        torch.set_num_threads(1)  # the parent's checks must not compete with the child for CPUs
        child_module.same_malloc()  # the reference's allocations served as the submission's are
        if not torch.cuda.is_available():
            result.flags.append("cpu-timing:no-l2-flush")
        try:
            self.start_phase({"benchmark": "benchmark", "profile": "profile"}.get(job.mode, "test"))
            # the child boots (interpreter, torch) while this process makes its device context and loads the problem;
            # it runs nothing of the submission before "import"
            with self.clock("child_start"):
                self.session = ChildSession.for_job(job)
            result.extra["child_start"] = "prestarted" if self.session.prestarted else "cold"
            result.extra["device_context"] = ("ahead" if self.session.warmed else "in the run"
                                              ) if torch.cuda.is_available() else "none"
            with self.clock("device_context"):
                device_context()  # at once when a spare parent made it ahead of its job
            with self.clock("problem_load"):
                self.problem = Problem(job.workdir)
            with self.clock("child_ready"):  # what is left of the child's interpreter start and torch import
                self.session.ready(self.deadline)
            if not torch.cuda.is_available() and (cases := job.tests or job.benchmarks):
                self.problem.generate(cases[0], 0)  # a problem that needs CUDA says so before any submission runs
            if job.mode in ("benchmark", "leaderboard"):
                with self.clock("calibrate"):
                    self.calibrate(job.benchmarks)
                    self.calibrate_late()  # ranked cases are among the benchmarks
            with self.clock("submission_import"):
                self.session.send("import", None, self.deadline, flags=backend_flags())
                hello = self.session.expect("hello", None, self.deadline)
            if isinstance(reported := hello.get("seconds"), dict):  # the child's own account: informational only
                result.extra["child_seconds"] = {str(k)[:40]: round(float(v), 4) for k, v in list(reported.items())[:8]
                                                 if isinstance(v, int | float) and not isinstance(v, bool)}
            if job.mode == "profile":
                with self.clock("profile"):
                    self.run_profile()
            if job.mode in ("test", "leaderboard"):
                with self.clock("tests"):
                    self.run_tests()
            if job.mode in ("benchmark", "leaderboard") and result.verdict == "pass":
                with self.clock("reference_start"):
                    self.start_reference()
                with self.clock("benchmark"):
                    result.benchmarks = self.run_timed("benchmark", job.benchmarks)
            if job.mode == "leaderboard" and result.verdict == "pass":
                with self.clock("ranked"):
                    result.ranked = self.run_timed("ranked", job.ranked_cases)
                times = [c.time for c in result.ranked if c.time]
                ratios = [c.ratio for c in result.ranked if c.ratio]
                weights = [c.reference.value for c in result.ranked if c.reference]
                result.extra["score"] = stats.combine(times, job.ranking_by).value
                result.extra["score_ratio"] = dataclasses.asdict(stats.combine(ratios, job.ranking_by, weights))
                result.extra["ranking_by"] = job.ranking_by
        except Stop as stop:
            self.stopped(stop)
        except OutOfMemory as oom:
            if self.session is not None:
                self.session.kill()
            result.out_of_memory(oom.judged, oom.said)
        except ProblemError as exc:  # its out-of-memory error is judged now, the child (and its memory) still here
            if device.oom_raised(exc.cause) and self.session is not None:
                said = device.exception_text(exc.cause)
                exc.blame = device.blame(self.session.memory_at_oom(), device.figures(said).asked, "problem")
            raise
        finally:
            with self.clock("teardown"):
                if self.problem is not None:
                    self.problem.close()
                if self.reference is not None:
                    self.reference.close(grace_s=1.0)
                close_spare_reference()
                if self.session is not None:
                    outcome = self.session.close()
            if self.session is not None:
                result.stdout, result.stderr = outcome.stdout, outcome.stderr
                result.sandbox = self.session.description
                result.extra["transport"] = self.transport()
                if self.session.lent.host_staged:
                    result.flags.append("transport:host-staged")
                if self.thread_ns:
                    result.extra["other_threads_ns"] = self.thread_ns
                if outcome.timed_out and result.verdict == "pass":
                    result.fail("timeout", f"the sandbox wall-time limit was exceeded ({outcome.reason})")
            result.extra["seconds"] = {k: round(v, 4) for k, v in self.seconds.items()}
            spent = {**(self.problem.seconds if self.problem is not None else {}), "lend": self.lent_s}
            result.extra["seconds_of"] = {k: round(v, 4) for k, v in spent.items()}
        return result

    def transport(self) -> str:
        assert self.session is not None
        kinds = {buf.kind for slots in self.session.lent.slots.values() for buf in slots.values()}
        if self.session.lent.host_staged:
            return f"CUDA tensors staged through host shared memory ({self.session.lent.host_staged})"
        return " and ".join(sorted({"cpu": "shared memory (memfd)", "cuda": "device memory shared by descriptor "
                                    "(cuMemCreate)"}[k] for k in kinds)) or "none"

    def stopped(self, stop: Stop) -> None:
        result, phase = self.result, self.phase
        if stop.verdict == "timeout":
            assert self.session is not None
            self.session.kill()
            limit = self.job.timeout("test" if phase == "profile" else phase)
            result.fail("timeout", f"timed out in the {phase} phase (limit {limit:g} s)")
        elif stop.verdict == "crash":
            assert self.session is not None
            outcome = self.session.close()
            how = outcome.reason or f"exit code {outcome.returncode}"
            if outcome.memory_exceeded:
                result.fail("memory_limit", f"{outcome.reason} (in the {phase} phase)")
            elif outcome.disk_exceeded or outcome.processes_exceeded:
                result.fail("crash", f"{outcome.reason} (in the {phase} phase)")
            elif outcome.timed_out:
                result.fail("timeout", f"timed out in the {phase} phase ({outcome.reason})")
            else:
                result.fail("crash", f"the submission's process ended during the {phase} phase ({how}):\n"
                            f"{tail(outcome.stderr)}")
        else:
            if self.session is not None:
                self.session.kill()
            result.fail(stop.verdict, stop.message)


def run(job: Job, emitter: Emitter) -> Result:
    return KernelbotRun(job, emitter).run()
