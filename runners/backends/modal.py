"""Runs a run on Modal: `spawn` the deployed app's function for the run's GPU type (runners/modal_app.py) and keep
the FunctionCall's id; a poll reads it with `get(timeout=0)`, a cancel cancels it.

Only the synchronous client with `timeout=0` is used, so no call waits on remote work. The Modal token comes from
the environment (MODAL_TOKEN_ID / MODAL_TOKEN_SECRET), never from the pool's settings."""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Callable
from typing import ClassVar, TypeVar

from django import forms

from .base import BackendUnavailable, Dispatch, Poll, PoolOptions, RemoteState, Reporter, RunnerBackend

try:
    import modal
    from modal import exception as modal_errors
except ImportError:  # pragma: no cover - modal is a dependency; available() says why when it is missing
    modal = None

DEFAULT_APP = "kernelbot"
CALL_TIMEOUT_S = 20.0  # the client retries a connection for ~63 s when Modal is unreachable; a worker waits this long
FUNCTION_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
T = TypeVar("T")
_clients: dict[tuple, modal.Client] = {}
_clients_lock = threading.Lock()


class ModalUnreachable(ConnectionError):
    """Modal did not answer in time: says nothing about the run (the lifecycle retries later)."""


def _bounded(call: Callable[[], T], what: str) -> T:
    """Run one client call on a side thread and give up waiting after CALL_TIMEOUT_S (the call itself may go on
    until the client's own retries end; a spawn that lands late belongs to a stale attempt, whose token the
    platform refuses)."""
    outcome: dict = {}
    done = threading.Event()

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name=f"modal-{what}", daemon=True).start()
    if not done.wait(CALL_TIMEOUT_S):
        raise ModalUnreachable(f"Modal did not answer {what} within {CALL_TIMEOUT_S:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class ModalOptions(PoolOptions):
    app_name = forms.CharField(required=False, max_length=64, help_text=(
        f"The deployed app (`modal deploy runners/modal_app.py`); empty: {DEFAULT_APP}."))
    functions = forms.JSONField(required=False, help_text=(
        'GPU type → function, e.g. {"H100": "run_h100", "H100:8": "run_h100_x8"}. A type not listed runs on '
        "run_<type in lower case>, e.g. A100-80GB → run_a100_80gb; N GPUs on one machine on run_<type>_xN."))
    environment_name = forms.CharField(required=False, max_length=64,
                                       help_text="The Modal environment; empty: the account's default.")

    def clean_app_name(self) -> str:
        return self.cleaned_data["app_name"].strip() or DEFAULT_APP

    def clean_functions(self) -> dict[str, str]:
        value = self.cleaned_data["functions"] or {}
        if not isinstance(value, dict):
            raise forms.ValidationError('An object of GPU type → function name, e.g. {"H100": "run_h100"}.')
        for gpu, name in value.items():
            if not isinstance(name, str) or not FUNCTION_NAME.match(name):
                raise forms.ValidationError(f"{gpu}: {name!r} is not a Python function name.")
        return value


def default_function(gpu_type: str, count: int = 1) -> str:
    name = "run_" + re.sub(r"[^a-z0-9]+", "_", gpu_type.lower()).strip("_")
    return name if count <= 1 else f"{name}_x{count}"


def _client() -> modal.Client:
    """One client per server and token (the client reconnects by itself in a forked worker)."""
    token_id, token_secret = os.environ.get("MODAL_TOKEN_ID", ""), os.environ.get("MODAL_TOKEN_SECRET", "")
    if not token_id or not token_secret:
        raise BackendUnavailable("Modal needs MODAL_TOKEN_ID and MODAL_TOKEN_SECRET in the environment")
    key = (modal.config.config.get("server_url"), token_id, token_secret)
    with _clients_lock:
        client = _clients.get(key)
    if client is None:  # connecting can take long when Modal is unreachable: not under the lock
        client = modal.Client.from_credentials(token_id, token_secret)
        with _clients_lock:
            client = _clients.setdefault(key, client)
    return client


class ModalBackend(RunnerBackend):
    options: ClassVar[type[forms.Form]] = ModalOptions
    secrets = {"Modal token id": "MODAL_TOKEN_ID", "Modal token secret": "MODAL_TOKEN_SECRET"}

    @classmethod
    def available(cls) -> str | None:
        if modal is None:
            return "the modal client is not installed"
        if not os.environ.get("MODAL_TOKEN_ID") or not os.environ.get("MODAL_TOKEN_SECRET"):
            return "set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET (a Modal API token) in the environment"
        return None

    def function_name(self, gpu_type: str, count: int = 1) -> str:
        key = gpu_type if count <= 1 else f"{gpu_type}:{count}"
        return self.settings.get("functions", {}).get(key) or default_function(gpu_type, count)

    def dispatch(self, job: Dispatch, reporter: Reporter) -> str:
        app, name = self.settings.get("app_name", DEFAULT_APP), self.function_name(job.gpu_type.name, job.gpu_count)
        environment = self.settings.get("environment_name") or None

        def spawn() -> modal.FunctionCall:
            function = modal.Function.from_name(app, name, environment_name=environment, client=_client())
            return function.spawn(run_id=job.run_id, attempt=job.attempt, nonce=job.nonce,
                                  platform_url=job.platform_url, timeout_s=job.timeout_s, token=job.token)

        try:
            call = _bounded(spawn, "spawn")
        except modal_errors.NotFoundError as exc:
            raise BackendUnavailable(
                f"GPU pool '{self.pool.name}': Modal has no function '{name}' in app '{app}'"
                f"{f' (environment {environment})' if environment else ''}: {exc}. Deploy runners/modal_app.py "
                "(`modal deploy runners/modal_app.py`) or map the GPU type to a deployed function in the pool's "
                "settings.") from None
        except (modal_errors.AuthError, modal_errors.PermissionDeniedError) as exc:
            raise BackendUnavailable(f"GPU pool '{self.pool.name}': Modal refused the token in MODAL_TOKEN_ID / "
                                     f"MODAL_TOKEN_SECRET: {exc}") from None
        return call.object_id

    def poll(self, external_id: str) -> Poll:
        call = _bounded(lambda: modal.FunctionCall.from_id(external_id, client=_client()), "connect")
        try:
            value = _bounded(lambda: call.get(timeout=0), "get")
        except modal_errors.OutputExpiredError:
            return Poll(RemoteState.LOST, "Modal no longer holds this call's output (expired)")
        except modal_errors.NotFoundError:
            return Poll(RemoteState.LOST, f"Modal does not know the call {external_id}")
        except modal_errors.FunctionTimeoutError as exc:
            return Poll(RemoteState.FAILED, f"the Modal function timed out: {exc}")
        except modal_errors.InternalFailure as exc:
            return Poll(RemoteState.FAILED, f"Modal infrastructure failure: {exc}")
        except TimeoutError:  # the builtin one: no output yet (modal's own TimeoutError is not a subclass)
            return self._unfinished(call)
        except (modal_errors.AuthError, modal_errors.PermissionDeniedError, modal_errors.ConnectionError,
                ModalUnreachable, BackendUnavailable):
            raise  # our side is wrong or Modal is unreachable: says nothing about the run
        except Exception as exc:  # the function raised (the agent could not deliver a verdict) or was terminated
            return Poll(RemoteState.FAILED, f"the Modal function failed: {type(exc).__name__}: {exc}"[:500])
        if not isinstance(value, dict):
            return Poll(RemoteState.FAILED, f"the Modal function returned {type(value).__name__}, not a result")
        return Poll(RemoteState.FINISHED, result=value)

    def _unfinished(self, call: modal.FunctionCall) -> Poll:
        """RUNNING once a container took the input (it has a task id), else QUEUED: the lifecycle treats RUNNING as
        started, so a call waiting for a GPU must not claim it. The call graph is best effort: unknown → QUEUED."""
        try:
            inputs = _bounded(call.get_call_graph, "get_call_graph")
        except modal_errors.Error:
            inputs = []
        task = next((i.task_id for i in inputs if i.function_call_id == call.object_id and i.task_id), "")
        if task:
            return Poll(RemoteState.RUNNING, f"running in Modal container {task}")
        return Poll(RemoteState.QUEUED, "waiting on Modal for a container")

    def cancel(self, external_id: str) -> None:
        with contextlib.suppress(modal_errors.NotFoundError):  # gone already: nothing left to stop
            _bounded(lambda: modal.FunctionCall.from_id(external_id, client=_client()).cancel(
                terminate_containers=True), "cancel")
