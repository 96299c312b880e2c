"""Whose fault an out-of-memory error on the device is. Stdlib only (the parent imports it before torch decides).

A CUDA allocation that fails while processes other than the run's hold memory on its device is the device's fault
(an infrastructure failure, retried where there is room, with the holders named for organisers). On an otherwise
empty device it is the fault of whoever asked: the problem's own code (a problem error) or the submission (a fail,
with what was asked, free and total). The holders come from nvidia-smi, read by the trusted parent, never from
anything the child says.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import re
import shutil
import subprocess

DEVICE_BUSY_FLAG = "device-busy"  # status "error": another process held the device's memory; the platform retries
BUSY_PREFIX = "the device ran out of memory while other processes held"  # how its error (the attempt's reason) starts
OOM = re.compile(r"OutOfMemoryError|CUDA out of memory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation"
                 r"|out of memory(?: on device| while)|HIP out of memory")
_SIZE = r"([0-9.]+) ?([KMGT]i?B)"
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def is_oom(text: str) -> bool:
    return bool(OOM.search(text))


def exception_text(exc: BaseException) -> str:
    """The exception and its causes, as one text to look for an OOM in."""
    parts, seen = [], exc
    while seen is not None and len(parts) < 8:
        parts.append(f"{type(seen).__name__}: {seen}")
        seen = seen.__cause__ or seen.__context__
    return "\n".join(parts)


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * _UNITS[unit[0]])


@dataclasses.dataclass(frozen=True)
class Figures:
    """What torch's allocator said: bytes asked, free and total on the device (None where it did not say)."""

    asked: int | None = None
    free: int | None = None
    total: int | None = None

    def describe(self) -> str:
        said = [f"{name} {mib(value)}" for name, value in (("asked", self.asked), ("free", self.free),
                                                            ("total", self.total)) if value is not None]
        return ", ".join(said)


def figures(text: str) -> Figures:
    """From torch's message: "Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which
    1.50 GiB is free." (older torch: "(GPU 0; 79.19 GiB total capacity; ...; 1.50 GiB free; ...)")."""
    asked = re.search(rf"Tried to allocate {_SIZE}", text)
    total = re.search(rf"total capacity of {_SIZE}", text) or re.search(rf"{_SIZE} total capacity", text)
    free = re.search(rf"of which {_SIZE} is free", text) or re.search(rf"{_SIZE} free", text)
    return Figures(*(_bytes(*m.groups()) if m else None for m in (asked, free, total)))


def mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


@dataclasses.dataclass(frozen=True)
class Holder:
    pid: int
    user: str
    memory: int  # bytes
    device: str  # its index on the host

    def as_dict(self) -> dict:
        return {"pid": self.pid, "user": self.user, "memory_mib": self.memory >> 20, "device": self.device}


def _user(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            uid = int(next(line.split()[1] for line in f if line.startswith("Uid:")))
    except (OSError, StopIteration, ValueError):
        return "?"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def holders(devices: list[str], own: int | None = None) -> list[Holder]:
    """Processes other than `own` and its descendants (this run) with memory on `devices` (host indices; all when
    empty), from nvidia-smi; none where it is missing or fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    own = os.getpid() if own is None else own

    def query(what: str) -> list[list[str]]:
        done = subprocess.run([smi, f"--query-{what}", "--format=csv,noheader,nounits"], capture_output=True,
                              text=True, timeout=20, check=False)
        return [[f.strip() for f in line.split(",")] for line in done.stdout.splitlines() if line.strip()]

    try:
        index_of = {bus.lower(): index for index, bus in query("gpu=index,pci.bus_id")}
        found = []
        for pid, memory, bus in query("compute-apps=pid,used_memory,gpu_bus_id"):
            device = index_of.get(bus.lower())
            if device is None or (devices and device not in devices) or not pid.isdigit():
                continue
            if descends_from(int(pid), own):
                continue
            used = int(memory) << 20 if memory.isdigit() else 0
            found.append(Holder(int(pid), _user(int(pid)), used, device))
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return []
    return found


def busy_message(found: list[Holder], said: str) -> str:
    listed = "; ".join(f"pid {h.pid} ({h.user}, {mib(h.memory)} on device {h.device})" for h in found[:8])
    total = sum(h.memory for h in found)
    return (f"{BUSY_PREFIX} {mib(total)} of it: {listed}. Not the "
            f"submission's fault nor the problem's; retried on a device with room. ({said.strip()[-300:]})")
