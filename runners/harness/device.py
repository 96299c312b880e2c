"""Whose fault an out-of-memory error on the device is. Stdlib only (the parent imports it before torch decides).

Whether an error is out of memory comes from its type as torch raised it (`torch.OutOfMemoryError`, alias
`torch.cuda.OutOfMemoryError`), never from words a submission can print. Who is to blame comes from the device's
memory measured by the trusted parent at the moment of failure, before the child is killed (`measure`: nvidia-smi,
else amd-smi, else rocm-smi, per process where the driver says; never on a MIG slice, whose processes' memory the
driver does not give): the run's own processes, other processes and their sizes, and the
request (`blame`). Others' memory is the cause (the device is busy: an infrastructure failure, retried, the holders
named for organisers) only when they hold a meaningful amount (`meaningful`) and enough to explain the failure; the
submission's when its own processes hold it or it asked for more than the device has; the problem's only when the
problem's own code failed on a device otherwise empty. What the child says (that it ran out, how much it asked) is
its own to write: it never moves the verdict towards the device or "unknown". Where the driver does not say who held
what, the parent apportions the device's use before and after it ends the child (`apportion`); where nothing can be
measured the answer is "unknown": neither the problem nor the competitor is charged, and the platform tries once more.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pwd
import re
import shutil
import subprocess

DEVICE_BUSY_FLAG = "device-busy"  # status "error": another process held the device's memory; the platform retries
OOM_UNKNOWN_FLAG = "oom-unknown"  # status "error": out of memory, the device unmeasured; the platform tries once more
UNKNOWN_PREFIX = "the device ran out of memory and whose fault it was is unknown"  # its error starts so
BUSY_PREFIX = "the device ran out of memory while other processes held"  # how its error (the attempt's reason) starts
_SIZE = r"([0-9.]+) ?([KMGT]i?B)"
MEANINGFUL_BYTES = 1 << 30  # others holding less than max(this, 5 % of the device) explain no failure
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def oom_raised(exc: BaseException | None) -> bool:
    """The exception, or one it was raised from, is torch's out-of-memory error (by its type, not its text)."""
    for _ in range(8):
        if exc is None:
            return False
        if any(cls.__name__ == "OutOfMemoryError" and cls.__module__.split(".")[0] == "torch"
               for cls in type(exc).__mro__):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


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


@dataclasses.dataclass(frozen=True)
class Memory:
    """The run's devices' memory at one moment: their total, what the run's own processes (`run_pid` and its
    descendants) and other processes held, and what pids this host cannot place (a container's driver reports the
    host's pids)."""

    source: str
    total: int
    run_pid: int
    own: list[Holder]
    others: list[Holder]
    unplaced: int = 0
    per_process: bool = True

    def held(self, child: bool | None = None) -> int:
        """Bytes the run held: all of it, its child's (the sandbox's processes) or the parent's own."""
        return sum(h.memory for h in self.own if child is None or (h.pid != self.run_pid) == child)

    def foreign(self) -> int:
        return sum(h.memory for h in self.others)

    def as_dict(self) -> dict:
        return {"source": self.source, "total_mib": self.total >> 20, "run_mib": self.held() >> 20,
                "others": [h.as_dict() for h in self.others], "unplaced_mib": self.unplaced >> 20,
                "per_process": self.per_process}


def _exists(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def _split(run_pid: int, found: list[tuple[int, int, str]], total: int, source: str) -> Memory:
    own, others, unplaced = [], [], 0
    for pid, used, index in found:
        if not _exists(pid):
            unplaced += used
        elif pid == run_pid or descends_from(pid, run_pid):
            own.append(Holder(pid, _user(pid), used, index))
        else:
            others.append(Holder(pid, _user(pid), used, index))
    return Memory(source, total, run_pid, own, others, unplaced)


def _run(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False).stdout


def _nvidia(smi: str, devices: list[str], run_pid: int) -> Memory | None:
    def query(what: str) -> list[list[str]]:
        return [[f.strip() for f in line.split(",")] for line in
                _run([smi, f"--query-{what}", "--format=csv,noheader,nounits"]).splitlines() if line.strip()]

    gpus = {row[1].lower(): row for row in query("gpu=index,pci.bus_id,memory.total") if len(row) == 3}
    mine = {bus: row for bus, row in gpus.items() if not devices or row[0] in devices}
    if not mine or not all(row[2].isdigit() for row in mine.values()):
        return None  # no device, or a MIG slice / container whose total the driver does not give
    indices = {row[0] for row in mine.values()}
    if any(len(row) == 2 and row[0] in indices and row[1].lower() == "enabled" for row in query(
            "gpu=index,mig.mode.current")):  # a separate query: drivers without MIG reject the field
        return None  # a MIG slice: the driver gives no process's memory, and the totals are the whole GPU's
    found = []
    for row in query("compute-apps=pid,used_memory,gpu_bus_id"):
        if len(row) == 3 and row[2].lower() in mine and row[0].isdigit():
            if not row[1].isdigit():
                return None  # "[N/A]", "[Not Supported]": who held what is not known, so none of it is claimed
            found.append((int(row[0]), int(row[1]) << 20, mine[row[2].lower()][0]))
    return _split(run_pid, found, sum(int(row[2]) << 20 for row in mine.values()), "nvidia-smi")


def _amount(value: object) -> int | None:
    """One of amd-smi's figures in bytes: {"value": 12, "unit": "MB"} (its MB are MiB) or a plain number of bytes."""
    number, unit = (value.get("value"), str(value.get("unit", "B"))) if isinstance(value, dict) else (value, "B")
    scale = 1 if unit.upper() == "B" else _UNITS.get(unit[:1].upper())
    if isinstance(number, bool) or not isinstance(number, (int, float)) or scale is None:
        return None
    return int(number * scale)


def _amd_gpus(smi: str, *args: str) -> list[dict]:
    """amd-smi's per-device JSON: a list of {"gpu": index, ...}, or {"gpu_data": [...]} (ROCm 7)."""
    doc = json.loads(_run([smi, *args, "--json"]) or "[]")
    rows = doc.get("gpu_data", [doc] if "gpu" in doc else []) if isinstance(doc, dict) else doc
    return [row for row in rows if isinstance(row, dict) and str(row.get("gpu", "")).isdigit()]


def _amd_totals(smi: str, devices: list[str], key: str) -> dict[str, int]:
    """amd-smi metric --mem-usage: {"gpu": 0, "mem_usage": {"total_vram": {"value": 196592, "unit": "MB"},
    "used_vram": {...}, ...}} per device; `key` of the run's devices, in bytes."""
    found = {str(row["gpu"]): _amount((row.get("mem_usage") or {}).get(key))
             for row in _amd_gpus(smi, "metric", "--mem-usage")}
    return {index: n for index, n in found.items() if n is not None and (not devices or index in devices)}


def _amd(smi: str, devices: list[str], run_pid: int) -> Memory | None:
    """amd-smi (ROCm 6+): totals from `metric --mem-usage`, processes from `process`: {"gpu": 0, "process_list":
    [{"process_info": {"pid": n, "memory_usage": {"vram_mem": {"value": bytes, "unit": "B"}, ...}, ...}}]} (the
    entry itself the process on newer tools, "No running processes detected" where none)."""
    mine = _amd_totals(smi, devices, "total_vram")
    if not mine:
        return None
    found = []
    for row in _amd_gpus(smi, "process"):
        index = str(row["gpu"])
        for entry in (row.get("process_list") or []) if index in mine else []:
            info = entry.get("process_info", entry) if isinstance(entry, dict) else entry
            if not isinstance(info, dict):
                continue  # no process on this device
            pid, used = info.get("pid"), _amount((info.get("memory_usage") or {}).get("vram_mem"))
            if not isinstance(pid, int) or used is None:
                return None  # a process whose memory the tool does not give: nobody's share is claimed
            found.append((pid, used, index))
    return _split(run_pid, found, sum(mine.values()), "amd-smi")


def _rocm(smi: str, devices: list[str], run_pid: int) -> Memory | None:
    """rocm-smi --json: {"card0": {"VRAM Total Memory (B)": ...}} and {"system": {"PID<n>": "name, gpus, vram B,
    ..."}} (per process only on one device: the pids' devices are not named)."""
    cards = json.loads(_run([smi, "--showmeminfo", "vram", "--json"]) or "{}")
    totals = {name.removeprefix("card"): int(info["VRAM Total Memory (B)"]) for name, info in cards.items()
              if name.startswith("card") and str(info.get("VRAM Total Memory (B)", "")).isdigit()}
    mine = {index: total for index, total in totals.items() if not devices or index in devices}
    if not mine:
        return None
    pids = json.loads(_run([smi, "--showpids", "--json"]) or "{}").get("system", {})
    found = []
    for key, value in pids.items():
        fields = [f.strip() for f in str(value).split(",")]
        if key.startswith("PID") and key[3:].isdigit() and len(fields) >= 3 and fields[2].isdigit():
            found.append((int(key[3:]), int(fields[2]), next(iter(mine))))
    memory = _split(run_pid, found, sum(mine.values()), "rocm-smi")
    return dataclasses.replace(memory, per_process=len(totals) == 1 or len(mine) == len(totals))


def measure(devices: list[str], run_pid: int | None = None) -> Memory | None:
    """The memory of `devices` (host indices; all when empty) now, from the driver's tool; None where none answers."""
    run_pid = os.getpid() if run_pid is None else run_pid
    for name, read in (("nvidia-smi", _nvidia), ("amd-smi", _amd), ("rocm-smi", _rocm)):
        if tool := shutil.which(name):
            try:
                if memory := read(tool, devices, run_pid):
                    return memory
            except (OSError, ValueError, KeyError, AttributeError, subprocess.TimeoutExpired):
                continue
    return None


def as_parents(memory: Memory, root: int) -> Memory:
    """`memory` with what `root` (a trusted child of the run's parent: the reference's) and its descendants hold
    counted as the parent's own, not as the sandboxed child's."""
    own = [dataclasses.replace(h, pid=memory.run_pid) if h.pid == root or descends_from(h.pid, root) else h
           for h in memory.own]
    return dataclasses.replace(memory, own=own)


def device_wide(free: int, total: int, run_pid: int | None = None) -> Memory:
    """torch.cuda.mem_get_info's figures where no tool answers: the total, nobody's share."""
    return Memory("torch", total, os.getpid() if run_pid is None else run_pid, [], [], total - free, False)


def used(devices: list[str]) -> int | None:
    """Bytes in use on `devices` (all when empty) as a whole, from the driver's tool; None where none answers."""
    if smi := shutil.which("nvidia-smi"):
        with contextlib.suppress(OSError, ValueError, subprocess.TimeoutExpired):
            rows = [[f.strip() for f in line.split(",")] for line in _run(
                [smi, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"]).splitlines() if line.strip()]
            mine = [int(row[1]) << 20 for row in rows if len(row) == 2 and (not devices or row[0] in devices)]
            if mine:
                return sum(mine)
    if smi := shutil.which("amd-smi"):
        with contextlib.suppress(OSError, ValueError, AttributeError, subprocess.TimeoutExpired):
            if mine := _amd_totals(smi, devices, "used_vram"):
                return sum(mine.values())
    if smi := shutil.which("rocm-smi"):
        with contextlib.suppress(OSError, ValueError, KeyError, AttributeError, subprocess.TimeoutExpired):
            cards = json.loads(_run([smi, "--showmeminfo", "vram", "--json"]) or "{}")
            mine = [int(info["VRAM Total Used Memory (B)"]) for name, info in cards.items() if name.startswith("card")
                    and (not devices or name.removeprefix("card") in devices)]
            if mine:
                return sum(mine)
    return None


def apportion(memory: Memory, before: int, after: int, parent: int, ended: int = 0) -> Memory:
    """Per-process figures from device-wide ones, for a device whose driver does not say who holds what: `before`
    and `after` the bytes in use while the run's child lived and once it was ended, `parent` the run's parent's own,
    `ended` what the run's trusted processes ended before `before` was read held (the reference's child: the
    parent's side). What the child's end freed was its share; what is left, less the parent's, other processes'."""
    child, others = max(0, before - after), max(0, after - parent)
    own = [Holder(memory.run_pid, "the run's parent", parent + ended, "?"), Holder(-1, "the run's child", child, "?")]
    return Memory(f"{memory.source}, device-wide before and after the run's child ended", memory.total,
                  memory.run_pid, own, [Holder(0, "unnamed", others, "?")] if others else [])


@dataclasses.dataclass(frozen=True)
class Blame:
    who: str  # "device" (others held it: infrastructure), "submission", "problem" or "unknown"
    why: str
    memory: Memory | None = None


def meaningful(total: int) -> int:
    """The least memory other processes must hold to be blamed for a failure: max(1 GiB, 5 % of the device). Less
    (a monitoring tool's context, a stray allocation) explains no out-of-memory error: a submission that allocates
    until it runs out always finds the last MiB taken by someone."""
    return max(MEANINGFUL_BYTES, total // 20)


def _explains(held: int, asked: int | None, room: int, floor: int) -> bool:
    """`held` bytes (at least `floor`) caused the failure: they held at least half of `room` (what the device left
    the asker), and where the request's size is known, without them it fitted and with them it did not."""
    if held < max(floor, 1):
        return False
    return 2 * held >= room and (asked is None or room - held < asked <= room)


def blame(memory: Memory | None, asked: int | None, where: str) -> Blame:
    """Whose fault the out-of-memory error of `where` ("submission": the child; "problem": the parent's problem
    code) is, from the memory measured at the failure. `asked`: the bytes the failed request asked for, where known;
    the child's figure is its own to write, so it only ever narrows the case against others (a request larger than
    the device, or one that others' memory does not explain), never makes one: others are blamed from the measured
    memory alone."""
    if memory is None:
        return Blame("unknown", "nothing could measure the device's memory")
    said = f"{mib(memory.total)} on the device, the run held {mib(memory.held())}, other processes " \
           f"{mib(memory.foreign())}" + (f", asked {mib(asked)}" if asked is not None else "")
    if asked is not None and asked > memory.total:
        return Blame(where, f"asked for more than the device has ({said})", memory)
    floor = meaningful(memory.total)
    foreign, child, parent = memory.foreign(), memory.held(child=True), memory.held(child=False)
    culprit = where
    if not memory.per_process:  # nobody's share is sure: whoever held the device, the run's child included
        if _explains(foreign + child + memory.unplaced, asked, memory.total - parent, floor):
            return Blame("unknown", f"the driver did not say which process held what ({said})", memory)
    elif where == "submission":
        if _explains(foreign, asked, memory.total - parent - child, floor):
            return Blame("device", f"other processes held enough to explain it ({said})", memory)
    else:
        if _explains(foreign + child, asked, memory.total - parent, floor):
            who = "device" if foreign >= child and foreign >= floor else "submission"
            return Blame(who, f"{'other processes' if who == 'device' else 'the submission'} held enough to "
                         f"explain it ({said})", memory)
        culprit = "problem"
    if memory.per_process and _explains(memory.unplaced, asked, memory.total - memory.held(), floor):
        return Blame("unknown", f"processes this host cannot place held enough to explain it ({said})", memory)
    return Blame(culprit, f"{said}; no other process held enough to explain it", memory)


def busy_message(found: list[Holder], said: str) -> str:
    listed = "; ".join(f"pid {h.pid} ({h.user}, {mib(h.memory)} on device {h.device})" if h.pid > 0 else
                       f"processes the driver does not name ({mib(h.memory)})" for h in found[:8])
    total = sum(h.memory for h in found)
    return (f"{BUSY_PREFIX} {mib(total)} of it: {listed}. Not the "
            f"submission's fault nor the problem's; retried on a device with room. ({said.strip()[-300:]})")
