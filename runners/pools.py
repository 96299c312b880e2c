"""The backends a pool may use here, their settings forms and the secrets they read from the environment.

Conventions a backend follows (runners/backends/base.py): `options`, a Django form class of the pool's settings (the
admin renders its fields with their help texts and stores its cleaned data in `GpuPool.settings`); `available()`,
None when the backend is usable here, else why not. A settings field whose name ends in `_env` holds the NAME of an
environment variable with a secret (the value never enters the database); `secrets`, a class attribute mapping a
label to an environment variable, names fixed ones; a remote backend (`remote = True`) also reads the pool's runner
key from `runner_key_env` or KERNELBOT_RUNNER_KEY.

A node's memory containment (`containment`): from the sandbox facts of its last probe, whether runs there get a
memory cgroup for their whole process tree, and what that means for the pool's health: none under
KERNELBOT_SANDBOX=require fails the pool (the node refuses every run), none otherwise is a warning (per-process memory
limits only)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from django import forms

from .backends.base import BackendUnavailable, RunnerBackend, available_backends, backend_class
from .models import RunnerBackendName

RUNNER_KEY_ENV = "KERNELBOT_RUNNER_KEY"  # base.runner_key's default (settings.RUNNER_KEY reads it)
MEMORY_FIX_DOC = "docs/operations.md#delegating-the-memory-controller-to-the-runner"
MEMORY_FIX = f"delegate the memory controller to the runner's service ({MEMORY_FIX_DOC})"


@dataclass(frozen=True)
class BackendChoice:
    name: str
    label: str
    cls: type[RunnerBackend] | None
    unavailable: str | None  # why it cannot be used here, None when it can

    @property
    def options(self) -> type[forms.Form] | None:
        return getattr(self.cls, "options", None)


def backend_choices() -> list[BackendChoice]:
    """Every backend name with its class and whether it is usable here (`base.available_backends`), else why not."""
    usable = available_backends()
    found = []
    for name, label in RunnerBackendName.choices:
        if name in usable:
            found.append(BackendChoice(name, label, usable[name], None))
            continue
        try:
            cls = backend_class(name)
        except BackendUnavailable as exc:
            found.append(BackendChoice(name, label, None, str(exc)))
            continue
        found.append(BackendChoice(name, label, cls, cls.available() or "not usable here"))
    return found


def secret_envs(choice: BackendChoice, settings: dict) -> list[tuple[str, str]]:
    """(what, environment variable) for each secret the backend reads with these settings."""
    found: list[tuple[str, str]] = []
    if choice.cls is not None and choice.cls.remote:
        found.append(("Runner key (it stays here: runners get per-attempt tokens)",
                      settings.get("runner_key_env") or RUNNER_KEY_ENV))
    found += list(choice.cls.secrets.items()) if choice.cls is not None else []
    if choice.options is not None:
        for name, field in choice.options.base_fields.items():
            if name.endswith("_env") and name != "runner_key_env":
                env = settings.get(name) or field.initial or getattr(choice.options, "DEFAULTS", {}).get(name)
                if env:
                    found.append((str(field.label or name.replace("_", " ").capitalize()), str(env)))
    return found


def env_state(name: str) -> str:
    return "set" if os.environ.get(name) else "NOT SET"


class Contained:
    CGROUP = "cgroup"  # every run's tree gets a memory cgroup
    PER_PROCESS = "per-process"  # runs go on, with per-process memory limits only (a warning)
    REFUSED = "refused"  # KERNELBOT_SANDBOX=require without a memory cgroup: the node refuses every run
    UNKNOWN = "unknown"  # never probed, or probed by a harness too old to say


@dataclass(frozen=True)
class Containment:
    """Whether runs on node `hostname` have their memory contained, from its last probe's sandbox facts."""

    hostname: str
    state: str  # a Contained value
    why: str  # the memory cgroup in use ("v2 /sys/fs/cgroup/..."), or why there is none
    mode: str  # its KERNELBOT_SANDBOX ("" when unknown)
    cpu: str = ""  # what limits a run's CPU there (probe's `cpu_limit`), "" when not reported

    @property
    def problem(self) -> str:
        """Why the node's pool is unhealthy; "" when this node is no reason."""
        if self.state != Contained.REFUSED:
            return ""
        return (f"node {self.hostname} cannot contain memory: {self.why}; {MEMORY_FIX}. Under KERNELBOT_SANDBOX="
                "require it refuses every run until it can")

    @property
    def warning(self) -> str:
        """What an organiser should know although the pool takes runs; "" when nothing."""
        if self.state != Contained.PER_PROCESS:
            return ""
        if self.mode == "none":
            return (f"runs on node {self.hostname} have per-process memory limits only: KERNELBOT_SANDBOX=none "
                    "(development only; unset it or set require)")
        return (f"runs on node {self.hostname} have per-process memory limits only: {self.why}; {MEMORY_FIX}, "
                "then set KERNELBOT_SANDBOX=require")

    @property
    def summary(self) -> str:
        if self.state == Contained.CGROUP:
            text = f"{self.hostname}: each run's memory is contained by a cgroup in {self.why}"
        elif self.state == Contained.UNKNOWN:
            return f"{self.hostname}: {self.why}"
        else:
            text = self.problem or self.warning
        return f"{text}; CPU: {self.cpu}" if self.cpu else text


def containment(hostname: str, facts: dict | None) -> Containment:
    """A node's containment from the `sandbox` facts of its probe report (`runners.harness.probe.sandbox_facts`)."""
    if not facts or "memory_cgroup" not in facts:
        return Containment(hostname, Contained.UNKNOWN, "not reported yet (a health check reports it for a pool on "
                           "this machine, manage.py register_node with the node's current probe for another)", "")
    mode, cpu = str(facts.get("mode") or "auto"), str(facts.get("cpu_limit") or "")
    if facts["memory_cgroup"]:
        return Containment(hostname, Contained.CGROUP, str(facts["memory_cgroup"]), mode, cpu)
    why = str(facts.get("memory_cgroup_error") or "no memory cgroup is usable")
    return Containment(hostname, Contained.REFUSED if mode == "require" else Contained.PER_PROCESS, why, mode, cpu)
