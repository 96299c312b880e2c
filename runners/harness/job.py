"""The job read from stdin: parsing, defaults and validation (see __main__ for the full contract)."""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
from typing import Any

from .contract import DEFAULT_LIMITS, DEFAULT_PHASE_TIMEOUT_S, LANGS, MODES, PROTOCOLS, TIMING_DEFAULTS, TOTAL_MARGIN_S
from .contract import RANKING_RULES as RANKINGS
from .sandbox import Limits

Case = dict[str, int | str | bool | list[int | str | bool]]  # as task.yml gives them (see problem.case_args)


class JobError(ValueError):
    """The job itself is malformed (an infrastructure error, not the submission's fault)."""


@dataclasses.dataclass(frozen=True)
class Timing:  # defaults: contract.TIMING_DEFAULTS
    rel_ci: float = TIMING_DEFAULTS["rel_ci"]
    min_samples: int = TIMING_DEFAULTS["min_samples"]
    max_samples: int = TIMING_DEFAULTS["max_samples"]
    case_budget_s: float = TIMING_DEFAULTS["case_budget_s"]
    warmup_s: float = TIMING_DEFAULTS["warmup_s"]
    run_spread: float = TIMING_DEFAULTS["run_spread"]  # between-run spread of identical code (bench/fairness.py)


@dataclasses.dataclass(frozen=True)
class Cuda:
    """A `lang: cu` task's `config`, plus `headers` (its other files) and the GPU's `arch` ("90a"; "" = native)."""

    sources: tuple[str, ...] = ()
    headers: tuple[str, ...] = ()
    include_dirs: tuple[str, ...] = ()
    defines: dict[str, str | None] = dataclasses.field(default_factory=dict)
    compile_flags: tuple[str, ...] = ()
    arch: str = ""


@dataclasses.dataclass(frozen=True, repr=False)
class Job:
    mode: str
    workdir: str
    protocol: str = "kernelbot"
    lang: str = "py"
    main: str = "eval.py"
    tests: tuple[Case, ...] = ()
    benchmarks: tuple[Case, ...] = ()
    ranking_by: str = "last"
    seed: int = 0  # secret: never printed, never passed to the child
    multi_gpu: bool = False
    gpus: tuple[str, ...] = ()
    timeouts: dict[str, float] = dataclasses.field(default_factory=dict)
    limits: dict[str, int] = dataclasses.field(default_factory=dict)
    timing: Timing = Timing()
    cuda: Cuda = Cuda()
    nonce: str = ""  # echoed in the result so the caller can reject result lines forged by the child
    # Host uid the child runs as (when the harness is root). RLIMIT_NPROC counts per uid, so concurrent
    # runs on one machine get one uid per device slot, from a block of uids per installation.
    sandbox_uid: int = 65534

    def __repr__(self) -> str:  # keep the seed out of tracebacks and logs
        return f"Job(mode={self.mode!r}, protocol={self.protocol!r}, workdir={self.workdir!r})"

    def timeout(self, phase: str) -> float:
        return float(self.timeouts.get(phase, DEFAULT_PHASE_TIMEOUT_S))

    def sandbox_limits(self) -> Limits:
        total = sum(self.timeout(p) for p in ("test", "benchmark", "ranked")) + TOTAL_MARGIN_S
        fields = {f.name for f in dataclasses.fields(Limits)} - {"wall_seconds"}
        limits = {**DEFAULT_LIMITS, **self.limits}
        return Limits(wall_seconds=total, **{k: v for k, v in limits.items() if k in fields})

    @property
    def ranked_cases(self) -> tuple[Case, ...]:
        return self.benchmarks[-1:] if self.ranking_by == "last" else self.benchmarks


def _choice(raw: dict, key: str, allowed: tuple[str, ...], default: str) -> str:
    value = raw.get(key, default)
    if value not in allowed:
        raise JobError(f"{key} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def _case_value(v: Any) -> bool:
    scalar = (int, str)  # bool is an int
    return isinstance(v, scalar) or (isinstance(v, list) and all(isinstance(x, scalar) for x in v))


def _cases(raw: dict, key: str) -> tuple[Case, ...]:
    cases = raw.get(key) or []
    if not isinstance(cases, list) or not all(
        isinstance(c, dict) and all(_case_value(v) for v in c.values()) for c in cases
    ):
        raise JobError(f"{key} must be a list of objects with int/str/bool values or flat lists of them")
    return tuple(dict(c) for c in cases)


def parse_job(raw: Any) -> Job:
    if not isinstance(raw, dict):
        raise JobError("the job must be a JSON object")
    for key in ("mode", "workdir"):
        if key not in raw:
            raise JobError(f"missing required key {key!r}")
    workdir = raw["workdir"]
    if not isinstance(workdir, str) or not os.path.isabs(workdir) or not os.path.isdir(workdir):
        raise JobError(f"workdir must be an existing absolute directory, got {workdir!r}")
    seed = raw.get("seed")
    if seed is None:
        seed = secrets.randbits(63)
    if not isinstance(seed, int):
        raise JobError("seed must be an integer")
    timing_keys = {f.name for f in dataclasses.fields(Timing)}
    timing = {k: v for k, v in (raw.get("timing") or {}).items() if k in timing_keys}
    return Job(
        mode=_choice(raw, "mode", MODES, "test"),
        workdir=workdir,
        protocol=_choice(raw, "protocol", PROTOCOLS, "kernelbot"),
        lang=_choice(raw, "lang", LANGS, "py"),
        main=str(raw.get("main") or "eval.py"),
        tests=_cases(raw, "tests"),
        benchmarks=_cases(raw, "benchmarks"),
        ranking_by=_choice(raw, "ranking_by", RANKINGS, "last"),
        seed=seed,
        multi_gpu=bool(raw.get("multi_gpu", False)),
        gpus=tuple(str(g) for g in raw.get("gpus") or ()),
        timeouts={k: float(v) for k, v in (raw.get("timeouts") or {}).items()},
        limits={k: int(v) for k, v in (raw.get("limits") or {}).items()},
        timing=Timing(**timing),
        cuda=_cuda(raw.get("cuda") or {}),
        nonce=str(raw.get("nonce") or ""),
        sandbox_uid=_uid(raw.get("sandbox_uid", 65534)),
    )


def _cuda(raw: Any) -> Cuda:
    if not isinstance(raw, dict):
        raise JobError("cuda must be an object")

    def names(key: str) -> tuple[str, ...]:
        value = raw.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise JobError(f"cuda.{key} must be a list of strings")
        return tuple(value)

    files = names("sources") + names("headers")
    if bad := [f for f in files if os.path.isabs(f) or ".." in f.split("/")]:
        raise JobError(f"cuda sources and headers must be paths inside the workdir, got {', '.join(bad)}")
    defines = raw.get("defines") or {}
    if not isinstance(defines, dict) or not all(isinstance(k, str) and k.isidentifier() for k in defines):
        raise JobError("cuda.defines must map identifiers to values")
    if bad := [f for f in names("compile_flags") if not f.startswith("-")]:
        raise JobError(f"cuda.compile_flags must start with a dash, got {', '.join(bad)}")
    arch = str(raw.get("arch") or "")
    if arch and not re.fullmatch(r"\d{2,3}[a-z]?", arch):
        raise JobError(f"cuda.arch must look like 90 or 90a, got {arch!r}")
    return Cuda(sources=names("sources"), headers=names("headers"), include_dirs=names("include_dirs"),
                defines={k: None if v is None else str(v) for k, v in defines.items()},
                compile_flags=names("compile_flags"), arch=arch)


def _uid(value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1000 <= value < 1 << 31 or value == 65535:
        raise JobError(f"sandbox_uid must be an unprivileged uid (1000..2^31-1, not 65535), got {value!r}")
    return value
