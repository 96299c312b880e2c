"""What a node really has: its accelerators (index, name, uuid, memory) or none, from nvidia-smi, rocm-smi or torch,
and what the sandbox can do there (`sandbox`: its mode, backend, and the memory cgroup runs are nested in, or why none
is usable).

Django-free like the rest of the harness: `python -m runners.harness.probe` prints the JSON on a node (a Slurm
node, a runner machine) for `manage.py register_node --probe-file`; the platform calls `probe()` for this machine.
torch is imported only when a device node exists but neither smi tool does (its import takes seconds)."""

from __future__ import annotations

import csv
import glob
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from typing import Any

TIMEOUT_S = 30


def _run(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _number(value: Any) -> int | None:
    try:
        return int(float(str(value).strip()))
    except ValueError:
        return None


def nvidia_devices() -> list[dict] | None:
    if not shutil.which("nvidia-smi"):
        return None
    out = _run(["nvidia-smi", "--query-gpu=index,name,uuid,memory.total", "--format=csv,noheader,nounits"])
    if out is None:
        return None
    return [{"index": int(row[0]), "name": row[1].strip(), "uuid": row[2].strip(), "memory_mib": _number(row[3]),
             "vendor": "nvidia"}
            for row in csv.reader(out.splitlines(), skipinitialspace=True) if len(row) >= 4 and row[0].isdigit()]


ROCM_NAME_KEYS = ("Card Series", "Card series", "Marketing Name", "Card SKU", "Card model", "Card Model")


def amd_devices() -> list[dict] | None:
    if not shutil.which("rocm-smi"):
        return None
    out = _run(["rocm-smi", "--showproductname", "--showuniqueid", "--showmeminfo", "vram", "--json"])
    try:
        cards = json.loads(out) if out else None
    except ValueError:
        return None
    if not isinstance(cards, dict):
        return None
    devices = []
    for card, info in sorted(cards.items()):
        if not (match := re.fullmatch(r"card(\d+)", card)) or not isinstance(info, dict):
            continue
        name = next((str(info[k]) for k in ROCM_NAME_KEYS if info.get(k)), "AMD GPU")
        devices.append({"index": int(match.group(1)), "name": name, "uuid": str(info.get("Unique ID", "")),
                        "memory_mib": (_number(info.get("VRAM Total Memory (B)", "")) or 0) >> 20 or None,
                        "vendor": "amd"})
    return devices


def torch_devices() -> list[dict] | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return []
    vendor = "amd" if getattr(torch.version, "hip", None) else "nvidia"
    devices = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        uuid = str(getattr(props, "uuid", "") or "")
        devices.append({"index": i, "name": props.name, "uuid": f"GPU-{uuid}" if uuid and vendor == "nvidia" else uuid,
                        "memory_mib": props.total_memory >> 20, "vendor": vendor})
    return devices


def has_device_nodes() -> bool:
    return bool(glob.glob("/dev/nvidia[0-9]*") or os.path.exists("/dev/kfd"))


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine() or "unknown"


def memory_mib() -> int | None:
    try:
        return (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) >> 20
    except (OSError, ValueError):
        return None


def sandbox_facts() -> dict[str, Any]:
    """What a run's sandbox would have on this node, under this process's KERNELBOT_SANDBOX and KERNELBOT_CGROUP:
    `mode`; `backend` (bubblewrap, rlimits-only, or unavailable with `error`); `memory_cgroup`, the group runs' memory
    cgroups are nested in ("v2 /sys/fs/cgroup/..."), or None with `memory_cgroup_error` saying why none is usable;
    `process_limit`, what bounds a run's processes ("pids cgroup", or the uid's RLIMIT_NPROC); `cpu_limit`, what bounds
    its CPU ("cpu cgroup v1 (...): each run gets its devices' share ...", or nice and RLIMIT_CPU, and why)."""
    from . import cgroups, sandbox

    try:
        mode = sandbox._mode()
    except ValueError as exc:
        return {"mode": os.environ.get("KERNELBOT_SANDBOX", ""), "backend": "unavailable", "error": str(exc),
                "memory_cgroup": None, "memory_cgroup_error": str(exc)}
    described = sandbox.describe()
    facts: dict[str, Any] = {"mode": mode, "backend": described.get("backend", "unavailable"),
                             "memory_cgroup": None, "memory_cgroup_error": "",
                             "process_limit": described.get("processes", {}).get("bound_by"),
                             "cpu_limit": _cpu_words(described.get("cpu"))}
    if described.get("error"):
        facts["error"] = described["error"]
    if mode == "none":
        facts["memory_cgroup_error"] = "KERNELBOT_SANDBOX=none: no memory cgroup is used"
        return facts
    try:
        facts["memory_cgroup"] = str(cgroups.memory_parent())
    except cgroups.CgroupUnavailable as exc:
        facts["memory_cgroup_error"] = str(exc) or "no memory cgroup is usable"
    return facts


def _cpu_words(cpu: dict | None) -> str | None:
    if not cpu:
        return None
    if cpu.get("limit_cores") is None:
        return str(cpu["bound_by"])
    return (f"{cpu['bound_by']}: each run gets its devices' share of the {cpu['of_cores']} cores less a reserve "
            f"({cpu['limit_cores']:g} on a node of one device) or the pool's cores per device")


def probe() -> dict[str, Any]:
    devices, source = None, "none"
    for name, find in (("nvidia-smi", nvidia_devices), ("rocm-smi", amd_devices)):
        if (devices := find()) is not None:
            source = name
            break
    if devices is None and has_device_nodes():
        devices, source = torch_devices(), "torch"
    return {"hostname": socket.gethostname(), "cpu": cpu_model(), "cpus": os.cpu_count(), "memory_mib": memory_mib(),
            "devices": devices or [], "source": source if devices else "none", "sandbox": sandbox_facts()}


# words in a device's name that say its vendor (torch's device name for a result, nvidia-smi's or rocm-smi's here)
VENDOR_WORDS = {"nvidia": {"nvidia", "tesla", "geforce", "quadro"}, "amd": {"amd", "radeon", "instinct"},
                "intel": {"intel"}}


def _words(name: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", name.lower())


def name_matches(type_name: str, device_name: str) -> bool:
    """A GPU type's name is a device's model: its first word is a word of the device's name (a letter suffix
    allowed after a model number: MI300 in "AMD Instinct MI300X", not L4 in "NVIDIA L40S" nor A10 in "A100"), its
    further words (memory, form factor) follow in order: A100-80GB in "NVIDIA A100-SXM4-80GB", RTX 4090 in "NVIDIA
    GeForce RTX 4090". Known limit: L40 also matches "NVIDIA L40S" (registration prefers the longest type name)."""
    want, have = _words(type_name), _words(device_name)
    if not want:
        return False
    model = re.compile(re.escape(want[0]) + ("[a-z]*" if want[0][-1].isdigit() else ""))
    for i, word in enumerate(have):
        if model.fullmatch(word):
            rest = iter(have[i + 1:])
            if all(w in rest for w in want[1:]):
                return True
    return False


def device_is(type_name: str, vendor: str, device_name: str, device_vendor: str = "") -> bool:
    """Whether a device (its name, and its vendor when the probe knows it) is a `type_name` GPU of `vendor`: the
    one check used for nodes (registration, device checks) and for results (their system info's device). A CPU
    type fits every device; a GPU type no CPU."""
    if vendor == "cpu":
        return True
    device = device_name.strip()
    if not device or device.lower() == "cpu":
        return False
    if device_vendor and device_vendor != vendor:
        return False
    words = set(_words(device))
    if not words & VENDOR_WORDS.get(vendor, set()) and any(
            words & names for other, names in VENDOR_WORDS.items() if other != vendor):
        return False
    return name_matches(type_name, device)


def device_mismatch(type_name: str, vendor: str, index: int, report: dict[str, Any]) -> str | None:
    """Why the device `index` of a node (its probe `report`) is not a `type_name` GPU of `vendor`; None when it is.
    A CPU type fits every node."""
    if vendor == "cpu":
        return None
    devices = {d["index"]: d for d in report.get("devices", [])}
    where = report.get("hostname") or "this node"
    if not devices:
        return f"{where} has no GPU (CPU only: {report.get('cpu', 'unknown CPU')}), so it cannot serve {type_name}"
    device = devices.get(index)
    if device is None:
        return f"{where} has no device #{index} (it has #{', #'.join(map(str, sorted(devices)))})"
    if not device_is(type_name, vendor, device.get("name", ""), device.get("vendor", "")):
        return f"device #{index} on {where} is a {device.get('name') or 'device without a name'}, not {type_name}"
    return None


def main() -> None:
    json.dump(probe(), sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
