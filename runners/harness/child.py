"""The UNTRUSTED side of the kernelbot protocol: imports the submission and runs `custom_kernel`.

Shipped on its own (copied into the sandbox's working directory and run as a script), so it imports
nothing from the harness. Nothing it reports is believed: the trusted parent checks every output against
its own reference and checks the reported times against the wall time it watched. Everything here only
makes honest submissions measurable and catches careless cheats early with a clear message.

Frames on the pipes: `>II` (header length, payload length), a JSON header, then raw payload bytes.
Parent -> child: {"op": "call"|"time"|"profile"|"exit", "id": k} + torch.save(inputs).
Child -> parent: {"op": "hello"}, {"op": "sample", "ns"}, {"op": "output"} + torch.save(output),
{"op": "error", "kind": "import|kernel|output|threads|tamper", "message"}, {"op": "profile", "report"}.
"""

import time

# Captured before torch and the submission are imported: the submission cannot patch these references.
_perf_ns = time.perf_counter_ns
_CLOCKS = {name: getattr(time, name) for name in ("perf_counter", "perf_counter_ns", "monotonic",
                                                   "monotonic_ns", "time", "time_ns", "process_time")}

import contextlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import struct  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import traceback  # noqa: E402

FRAME = struct.Struct(">II")
L2_FLUSH_BYTES = 256 << 20


def write_frame(fd: int, header: dict, payload: bytes = b"") -> None:
    blob = json.dumps(header).encode()
    data = memoryview(FRAME.pack(len(blob), len(payload)) + blob + payload)
    while data:
        data = data[os.write(fd, data):]


def _read_exact(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> tuple[dict, bytes]:
    hlen, plen = FRAME.unpack(_read_exact(fd, FRAME.size))
    return json.loads(_read_exact(fd, hlen)), _read_exact(fd, plen)


def _format_error() -> str:
    """The current exception's traceback without the harness's own frames."""
    exc = traceback.TracebackException(*sys.exc_info())
    exc.stack = traceback.StackSummary.from_list([f for f in exc.stack if f.filename != __file__][-8:])
    return "".join(exc.format())[-4000:]


def _tasks() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


class Runner:
    def __init__(self, out_fd: int):
        import torch

        self.torch, self.out_fd = torch, out_fd
        self.cuda = torch.cuda.is_available()
        # Spin up torch's own thread pools first so they count as the baseline, not as the submission's.
        torch.ones(1 << 16).sum()
        self.sync = torch.cuda.synchronize if self.cuda else None
        if self.cuda:
            self.event, self.elapsed = torch.cuda.Event, torch.cuda.Event.elapsed_time
            self.flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
        self.watched = {**{f"time.{k}": v for k, v in _CLOCKS.items()}, "torch.cuda.synchronize":
                        torch.cuda.synchronize, "torch.cuda.Event": torch.cuda.Event}
        self.baseline_tasks = _tasks()
        self.kernel = None

    def send(self, header: dict, payload: bytes = b"") -> None:
        write_frame(self.out_fd, header, payload)

    def tampering(self) -> str | None:
        import torch

        current = {**{f"time.{k}": getattr(time, k) for k in _CLOCKS}, "torch.cuda.synchronize":
                   torch.cuda.synchronize, "torch.cuda.Event": torch.cuda.Event}
        changed = [k for k, v in current.items() if v is not self.watched[k]]
        return f"the submission replaced {', '.join(changed)}" if changed else None

    def threads(self) -> str | None:
        if threading.active_count() > 1:
            names = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
            return f"the submission has threads running ({', '.join(names)}); timing refused"
        if _tasks() > self.baseline_tasks:
            return f"the submission has {_tasks() - self.baseline_tasks} extra native threads; timing refused"
        return None

    def import_submission(self) -> None:
        import submission

        kernel = getattr(submission, "custom_kernel", None)
        if not callable(kernel):
            raise AttributeError("submission.py does not define a callable custom_kernel(data)")
        self.kernel = kernel

    def output_problem(self, out) -> str | None:
        """Only a friendly early message: the parent checks its own copy (taken now) of every output. Writing
        into a preallocated output passed among the inputs (`(a, b, out)` -> `out`) is fine."""
        for t in list(out) if isinstance(out, (tuple, list)) else [out]:
            if type(t) is not self.torch.Tensor:
                return f"custom_kernel must return a plain torch.Tensor, got {type(t).__module__}.{type(t).__name__}"
        return None

    def serialize(self, obj) -> bytes:
        buf = io.BytesIO()
        self.torch.save(obj, buf)
        return buf.getvalue()

    def integrity(self) -> tuple[str, str] | None:
        if problem := self.tampering():
            return "tamper", problem
        if problem := self.threads():
            return "threads", problem
        return None

    def finish(self, rid: int, out) -> None:
        if problem := self.integrity():
            self.send({"op": "error", "id": rid, "kind": problem[0], "message": problem[1]})
            return
        problem = self.output_problem(out)
        if problem:
            self.send({"op": "error", "id": rid, "kind": "output", "message": problem})
            return
        self.send({"op": "output", "id": rid}, self.serialize(tuple(out) if isinstance(out, list) else out))

    def timed(self, data):
        if self.cuda:
            self.flush.zero_()
            start, end = self.event(enable_timing=True), self.event(enable_timing=True)
            self.sync()
            start.record()
            out = self.kernel(data)
            end.record()
            self.sync()
            return out, int(self.elapsed(start, end) * 1e6)
        t0 = _perf_ns()
        out = self.kernel(data)
        return out, _perf_ns() - t0

    def profile(self, data, calls: int):
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        with profile(activities=activities, record_shapes=True) as prof:
            for _ in range(calls):
                out = self.kernel(data)
            if self.cuda:
                self.sync()
        self.baseline_tasks = max(self.baseline_tasks, _tasks())  # the profiler keeps a native thread
        sort = "cuda_time_total" if self.cuda else "cpu_time_total"
        return out, prof.key_averages().table(sort_by=sort, row_limit=25)

    def serve(self, in_fd: int) -> None:
        while True:
            header, payload = read_frame(in_fd)
            op, rid = header.get("op"), header.get("id")
            if op == "exit":
                return
            data = self.torch.load(io.BytesIO(payload), weights_only=True)
            try:
                if op == "time":
                    if problem := self.integrity():
                        self.send({"op": "error", "id": rid, "kind": problem[0], "message": problem[1]})
                        continue
                    out, ns = self.timed(data)
                    self.send({"op": "sample", "id": rid, "ns": ns})
                elif op == "profile":
                    out, report = self.profile(data, int(header.get("calls", 5)))
                    self.send({"op": "profile", "id": rid, "report": report})
                else:
                    out = self.kernel(data)
            except Exception:
                message = _format_error()
                self.send({"op": "error", "id": rid, "kind": "kernel", "message": message})
                continue
            self.finish(rid, out)


def calibrate(runner: Runner, in_fd: int) -> None:
    """Before the submission exists in this process: echo (input, output) pairs so the parent can measure
    what moving one call's data costs, a figure the submission cannot inflate."""
    while True:
        header, payload = read_frame(in_fd)
        if header.get("op") != "echo":
            return
        split = int(header.get("split", 0))
        runner.torch.load(io.BytesIO(payload[:split]), weights_only=True)
        output = runner.torch.load(io.BytesIO(payload[split:]), weights_only=True)
        runner.send({"op": "echo", "id": header.get("id")}, runner.serialize(output))


def main(argv: list[str]) -> int:
    in_fd, out_fd = int(argv[1]), int(argv[2])
    runner = Runner(out_fd)
    with contextlib.suppress(EOFError):
        calibrate(runner, in_fd)
    try:
        runner.import_submission()
    except BaseException:
        runner.send({"op": "error", "kind": "import", "message": _format_error()})
        return 0
    runner.send({"op": "hello"})
    with contextlib.suppress(EOFError):
        runner.serve(in_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
