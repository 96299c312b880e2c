"""The result document (the last JSON line the harness prints) and the bits every protocol shares."""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import re
import sys
from typing import IO, Any

from . import device, sandbox
from .stats import Estimate, Summary

VERDICTS = ("pass", "fail", "compile_error", "crash", "timeout", "hacked", "memory_limit")
# Status "error" with this flag: the problem cannot run on this runner at all; the platform ends the run at once.
NEEDS_CUDA = "this problem needs a CUDA GPU; this runner has none"
NEEDS_CUDA_FLAG = "needs-cuda"
# Status "error" with this flag: the problem's own code (generate_input, ref_kernel, check_implementation) raised in
# the trusted parent. `error` is "the problem's own code failed: ..." (for organisers), the result's
# "problem_error" holds {"where": "generate_input|ref_kernel|check_implementation", "traceback": ...}. Not the
# submission's fault and not the runner's: the platform ends the run once, does not retry or charge it, and tells
# the organisers.
PROBLEM_ERROR_FLAG = "problem-error"
PROBLEM_BROKEN = "this problem is broken; the organisers have been told"
OUTPUT_CAP = 16 << 10  # characters of child stdout/stderr kept in the result


def cap(text: str, limit: int = OUTPUT_CAP) -> str:
    if len(text) <= limit:
        return text
    return text[: limit // 2] + "\n[... truncated ...]\n" + text[-limit // 2 :]


def tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def system_info(sandbox_description: dict[str, Any] | None = None) -> dict[str, Any]:
    info: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform(),
                            "sandbox": sandbox_description or sandbox.describe()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    except Exception as exc:  # torch missing or broken: still report what we can
        info["torch"], info["device"] = f"unavailable: {exc}", "cpu"
    info["driver"] = driver_version()
    info["cpu"] = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return info


def driver_version(path: str = "/proc/driver/nvidia/version") -> str:
    """The NVIDIA kernel driver's version ("580.159.04"), "" without one."""
    try:
        with open(path) as f:
            found = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", f.readline())
    except OSError:
        return ""
    return found.group(1) if found else ""


@dataclasses.dataclass
class CaseResult:
    spec: str
    status: str = "pass"
    message: str = ""
    timing: Summary | None = None
    stop_reason: str = ""
    wall_ns: int = 0
    # Interleaved timing (kernelbot protocol): medians over batches with 95 % intervals; `ratio` ranks.
    time: Estimate | None = None
    reference: Estimate | None = None
    ratio: Estimate | None = None
    batches: list[list[int]] | None = None  # per batch: submission min, reference min, and medians (ns)

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"spec": self.spec, "status": self.status, "message": self.message}
        if self.timing is not None:
            d.update(dataclasses.asdict(self.timing))
            d.update(stop_reason=self.stop_reason, wall_ns=self.wall_ns)
        for name in ("time", "reference", "ratio"):
            if (e := getattr(self, name)) is not None:
                d.update({name: e.value, f"{name}_low": e.low, f"{name}_high": e.high})
        if self.batches is not None:
            d["batches"] = self.batches
        return d


@dataclasses.dataclass
class Result:
    mode: str
    protocol: str
    verdict: str = "pass"
    error: str = ""
    status: str = "ok"
    tests: list[CaseResult] = dataclasses.field(default_factory=list)
    benchmarks: list[CaseResult] = dataclasses.field(default_factory=list)
    ranked: list[CaseResult] = dataclasses.field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    flags: list[str] = dataclasses.field(default_factory=list)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    sandbox: dict[str, Any] | None = None

    def fail(self, verdict: str, error: str) -> Result:
        """Record the first non-pass verdict (later ones are consequences of it)."""
        assert verdict in VERDICTS
        if self.verdict == "pass":
            self.verdict, self.error = verdict, error
        return self

    def device_busy(self, found: list[device.Holder], said: str) -> Result:
        """The device ran out of memory that other processes held: the runner's failure (the platform retries it),
        the holders named for organisers."""
        self.status, self.verdict, self.error = "error", "fail", device.busy_message(found, said)
        self.flags.append(device.DEVICE_BUSY_FLAG)
        self.extra["device_holders"] = [h.as_dict() for h in found]
        return self

    def out_of_memory(self, judged: device.Blame, said: str) -> Result:
        """An out-of-memory error charged to neither the submission nor the problem: the device's (other processes
        held enough to explain it; retried) or unknown (nothing measured the device; tried once more)."""
        if judged.who == "device" and judged.memory is not None:
            self.device_busy(judged.memory.others, said)
        else:
            self.status, self.verdict = "error", "fail"
            self.error = (f"{device.UNKNOWN_PREFIX}: {judged.why}. Charged "
                          f"neither to the submission nor to the problem; tried once more. ({said.strip()[-300:]})")
            self.flags.append(device.OOM_UNKNOWN_FLAG)
        if judged.memory is not None:
            self.extra["device_memory"] = judged.memory.as_dict()
        return self

    def as_dict(self, nonce: str = "") -> dict[str, Any]:
        d: dict[str, Any] = {
            "event": "result", "status": self.status, "verdict": self.verdict,
            "passed": self.status == "ok" and self.verdict == "pass", "error": self.error,
            "mode": self.mode, "protocol": self.protocol,
            "tests": [c.as_dict() for c in self.tests],
            "benchmarks": [c.as_dict() for c in self.benchmarks],
            "ranked": [c.as_dict() for c in self.ranked],
            "system": system_info(self.sandbox), "stdout": cap(self.stdout), "stderr": cap(self.stderr),
            "flags": self.flags, **self.extra,
        }
        if nonce:
            d["nonce"] = nonce
        return d


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


class Emitter:
    """Writes the JSON-lines protocol on the harness's own stdout."""

    def __init__(self, stream: IO[str]):
        self.stream = stream

    def line(self, obj: dict[str, Any]) -> None:
        self.stream.write(json.dumps(_finite(obj), allow_nan=False, default=str) + "\n")
        self.stream.flush()

    def progress(self, phase: str, done: int, total: int) -> None:
        self.line({"event": "progress", "phase": phase, "done": done, "total": total})
