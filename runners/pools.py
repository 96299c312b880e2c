"""The backends a pool may use here, their settings forms and the secrets they read from the environment.

Conventions a backend follows (runners/backends/base.py): `options`, a Django form class of the pool's settings (the
admin renders its fields with their help texts and stores its cleaned data in `GpuPool.settings`); `available()`,
None when the backend is usable here, else why not. A settings field whose name ends in `_env` holds the NAME of an
environment variable with a secret (the value never enters the database); `secrets`, a class attribute mapping a
label to an environment variable, names fixed ones; a remote backend (`remote = True`) also reads the pool's runner
key from `runner_key_env` or KERNELBOT_RUNNER_KEY."""

from __future__ import annotations

import os
from dataclasses import dataclass

from django import forms

from .backends.base import BackendUnavailable, RunnerBackend, available_backends, backend_class
from .models import RunnerBackendName

RUNNER_KEY_ENV = "KERNELBOT_RUNNER_KEY"  # base.runner_key's default (settings.RUNNER_KEY reads it)


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
        found.append(("Runner key (the remote side holds the same)", settings.get("runner_key_env") or RUNNER_KEY_ENV))
    found += list(choice.cls.secrets.items()) if choice.cls is not None else []
    if choice.options is not None:
        for name, field in choice.options.base_fields.items():
            if name.endswith("_env") and name != "runner_key_env":
                env = settings.get(name) or field.initial
                if env:
                    found.append((str(field.label or name.replace("_", " ").capitalize()), str(env)))
    return found


def env_state(name: str) -> str:
    return "set" if os.environ.get(name) else "NOT SET"
