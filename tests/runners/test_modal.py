"""The Modal backend and the app module we ship, through the unmodified modal client against a loopback grpclib fake
of Modal's control plane (tests/fakes/modal.py) that runs the deployed function in its own process."""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
import tarfile
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from modal_proto import api_pb2

from runners.backends import modal as modal_backend_module
from runners.backends.base import BackendUnavailable, Dispatch, RemoteState
from runners.backends.modal import ModalBackend, ModalUnreachable, default_function
from runners.models import GpuPool, GpuType
from tests.fakes.modal import FakeModal

RUNNER_KEY = "modal-secret-runner-key"


class NoReporter:
    """dispatch never reports: the agent does, through the platform's runner API."""

    def __getattr__(self, name):
        raise AssertionError(f"the Modal backend called reporter.{name}() during dispatch")


@pytest.fixture
def fake_modal(monkeypatch):
    with FakeModal(token_id="ak-test", token_secret="as-test") as fake:  # the app needs no Modal secret
        monkeypatch.setenv("MODAL_SERVER_URL", fake.url)
        monkeypatch.setenv("MODAL_TOKEN_ID", "ak-test")
        monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-test")
        yield fake


def backend(**settings) -> ModalBackend:
    return ModalBackend(GpuPool(name="modal-pool", backend="modal", settings=settings))


def job(run_id: int = 7, gpu: str = "H100", count: int = 1) -> Dispatch:
    return Dispatch(run_id=run_id, attempt=2, nonce="public-nonce", platform_url="http://platform.invalid",
                    gpu_type=GpuType(name=gpu), gpu_count=count, timeout_s=90, label=f"kernelbot run {run_id}",
                    token="the-attempts-token")


def spawned_args(fake: FakeModal) -> tuple:
    (request,) = [r for name, r in fake.requests if name == "FunctionMap"]
    return pickle.loads(request.pipelined_inputs[0].input.args)


def test_dispatch_spawns_the_gpu_types_function_with_public_arguments_only(fake_modal):
    fake_modal.deploy("kernelbot", "run_h100", "tests.fakes.modal_targets:echo")
    modal_backend = backend()
    call_id = modal_backend.dispatch(job(), NoReporter())

    assert call_id.startswith("fc-") and call_id in fake_modal.calls
    args, kwargs = spawned_args(fake_modal)
    assert args == () and kwargs == {"run_id": 7, "attempt": 2, "nonce": "public-nonce", "token": "the-attempts-token",
                                     "platform_url": "http://platform.invalid", "timeout_s": 90}
    fake_modal.wait(call_id)
    poll = modal_backend.poll(call_id)
    assert poll.state == RemoteState.FINISHED
    # the function holds its attempt's token only: no runner key in its container (no Modal secret is needed)
    assert poll.result == {"kwargs": kwargs, "key": None, "token": None}


def test_poll_while_the_function_runs_then_cancel_stops_it(fake_modal):
    fake_modal.deploy("kernelbot", "run_h100", "tests.fakes.modal_targets:hang")
    modal_backend = backend()
    call_id = modal_backend.dispatch(job(), NoReporter())
    fake_modal.wait_started(call_id)

    poll = modal_backend.poll(call_id)
    assert poll.state == RemoteState.RUNNING and fake_modal.calls[call_id].task_id in poll.detail
    modal_backend.cancel(call_id)
    assert fake_modal.wait(call_id).status == api_pb2.GenericResult.GENERIC_STATUS_TERMINATED
    assert fake_modal.calls[call_id].process.returncode is not None  # the container was stopped, not left running
    assert modal_backend.poll(call_id).state == RemoteState.FAILED


def test_a_call_waiting_for_a_container_is_queued_not_running(fake_modal):
    """The lifecycle takes RUNNING as started; a call Modal has not placed yet must keep its queue deadline."""
    fake_modal.deploy("kernelbot", "run_h100", "tests.fakes.modal_targets:echo")
    fake_modal.pause_containers()
    modal_backend = backend()
    call_id = modal_backend.dispatch(job(), NoReporter())

    assert modal_backend.poll(call_id).state == RemoteState.QUEUED
    modal_backend.cancel(call_id)
    fake_modal.wait(call_id)
    fake_modal.resume_containers()
    assert fake_modal.calls[call_id].process is None  # cancelled before any container ran it


def test_a_forked_worker_can_use_the_cached_client(fake_modal):
    """django-q forks its workers: the client cached before the fork must work in the child."""
    fake_modal.deploy("kernelbot", "run_h100", "tests.fakes.modal_targets:echo")
    call_id = backend().dispatch(job(), NoReporter())
    fake_modal.wait(call_id)
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            state = backend().poll(call_id).state
            os.write(writer, str(state).encode())
        finally:
            os._exit(0)
    os.close(writer)
    _, status = os.waitpid(child, 0)
    assert os.read(reader, 100).decode() == RemoteState.FINISHED and status == 0


def test_function_raising_is_a_failure_with_its_reason(fake_modal):
    fake_modal.deploy("kernelbot", "run_h100", "tests.fakes.modal_targets:boom")
    modal_backend = backend()
    call_id = modal_backend.dispatch(job(run_id=31), NoReporter())
    fake_modal.wait(call_id)

    poll = modal_backend.poll(call_id)
    assert poll.state == RemoteState.FAILED and "ValueError: boom in run 31" in poll.detail


def test_container_dying_is_an_infrastructure_failure(fake_modal):
    fake_modal.deploy("kernelbot", "run_h100", "tests.fakes.modal_targets:crash")
    modal_backend = backend()
    call_id = modal_backend.dispatch(job(), NoReporter())
    fake_modal.wait(call_id)

    poll = modal_backend.poll(call_id)
    assert poll.state == RemoteState.FAILED and "infrastructure" in poll.detail and "code 3" in poll.detail


def test_expired_and_unknown_calls_are_lost(fake_modal):
    fake_modal.deploy("kernelbot", "run_h100", "tests.fakes.modal_targets:echo")
    modal_backend = backend()
    call_id = modal_backend.dispatch(job(), NoReporter())
    fake_modal.wait(call_id)
    fake_modal.expire(call_id)

    assert modal_backend.poll(call_id).state == RemoteState.LOST
    unknown = modal_backend.poll("fc-doesnotexist000000000")
    assert unknown.state == RemoteState.LOST and "fc-doesnotexist" in unknown.detail
    modal_backend.cancel("fc-doesnotexist000000000")  # nothing to stop: no error


@pytest.mark.parametrize(("pool_settings", "message"), [
    ({"app_name": "other-app"}, "no function 'run_h100' in app 'other-app'"),
    ({"functions": {"H100": "run_h100_typo"}}, "no function 'run_h100_typo' in app 'kernelbot'"),
    ({"environment_name": "staging"}, "(environment staging)"),
])
def test_missing_app_or_function_is_a_configuration_error_asked_once(fake_modal, pool_settings, message):
    fake_modal.deploy("kernelbot", "run_h100", "tests.fakes.modal_targets:echo")
    with pytest.raises(BackendUnavailable, match="modal deploy") as error:  # not retried by the lifecycle
        backend(**pool_settings).dispatch(job(), NoReporter())
    assert message in str(error.value)
    assert [name for name, _ in fake_modal.requests] == ["FunctionGet"]  # no retries, nothing spawned


def test_refused_token_is_a_configuration_error(fake_modal, monkeypatch):
    fake_modal.deploy("kernelbot", "run_h100", "tests.fakes.modal_targets:echo")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "wrong")
    with pytest.raises(BackendUnavailable, match="Modal refused the token"):
        backend().dispatch(job(), NoReporter())
    assert fake_modal.calls == {}


def test_slow_modal_never_holds_the_worker(fake_modal, monkeypatch):
    """The client retries a connection for about a minute when Modal is down; the backend stops waiting sooner."""
    fake_modal.deploy("kernelbot", "run_h100", "tests.fakes.modal_targets:echo")
    monkeypatch.setattr(modal_backend_module, "CALL_TIMEOUT_S", 0.3)
    fake_modal.hold()
    try:
        for call in (lambda b: b.dispatch(job(), NoReporter()), lambda b: b.poll("fc-x"),
                     lambda b: b.cancel("fc-x")):
            with pytest.raises(ModalUnreachable, match="within 0.3 s"):  # transient: the lifecycle tries later
                call(backend())
    finally:
        fake_modal.release()
        for thread in threading.enumerate():
            if thread.name.startswith("modal-"):
                thread.join(10)
    assert len(fake_modal.calls) == 1  # the late spawn landed: its attempt is stale, its token refused


def test_gpu_type_to_function_mapping(fake_modal):
    fake_modal.deploy("kernelbot", "run_a100_80gb", "tests.fakes.modal_targets:echo")
    fake_modal.deploy("kernelbot", "multi", "tests.fakes.modal_targets:echo")
    modal_backend = backend(functions={"H100:8": "multi"})
    modal_backend.dispatch(job(gpu="A100-80GB"), NoReporter())
    modal_backend.dispatch(job(gpu="H100", count=8), NoReporter())
    assert [r.object_tag for name, r in fake_modal.requests if name == "FunctionGet"] == ["run_a100_80gb", "multi"]
    assert default_function("H100", 4) == "run_h100_x4"


def test_available_needs_the_token_in_the_environment(monkeypatch):
    monkeypatch.delenv("MODAL_TOKEN_ID", raising=False)
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-x")
    assert "MODAL_TOKEN_ID" in ModalBackend.available()
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-x")
    assert ModalBackend.available() is None


@pytest.mark.parametrize("pool_settings", [{"functions": ["run_h100"]}, {"functions": {"H100": "run h100; rm"}},
                                      {"app_name": "x" * 65}])
def test_invalid_pool_settings_are_refused(pool_settings):
    with pytest.raises(BackendUnavailable, match="modal-pool"):
        backend(**pool_settings)


def test_app_module_is_django_free_with_one_function_per_gpu_type():
    probe = textwrap.dedent("""
        import json, sys
        import modal, runners.modal_app as m
        functions = {name: f._spec_.gpus for name, f in vars(m).items() if isinstance(f, modal.Function)}
        print(json.dumps({"django": any(n.split(".")[0] == "django" for n in sys.modules), "functions": functions}))
    """)
    out = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
                     .stdout.splitlines()[-1])
    assert out["django"] is False
    assert {"run_h100", "run_a100_80gb", "run_l4", "run_b200"} <= set(out["functions"])
    for name, gpu in out["functions"].items():
        assert name == default_function(gpu.replace("-40GB", ""))  # each function's name is its GPU's default


STAND_IN_AGENT = '''
import argparse, json, os, sys
p = argparse.ArgumentParser()
for flag in ("--platform", "--run", "--attempt", "--result-file", "--workdir"):
    p.add_argument(flag)
a = p.parse_args()
if a.run == "13":
    sys.exit(2)
result = {"verdict": "stand-in", "argv": sys.argv[1:], "key": os.environ.get("KERNELBOT_RUNNER_KEY"),
          "token": os.environ.get("KERNELBOT_ATTEMPT_TOKEN"),
          "agent": os.path.abspath(__file__)}
with open(a.result_file, "w") as f:
    json.dump(result, f)
'''


@pytest.fixture
def stand_in_platform():
    """Serves a harness.tar.gz whose agent is a stand-in recording what it was started with (until the platform's
    own runner API and agent are on main, the app module's bootstrap is tested against this)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in {"runners/__init__.py": "", "runners/harness/__init__.py": "",
                           "runners/harness/agent.py": STAND_IN_AGENT}.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    archive = buffer.getvalue()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path == "/api/runner/v1/harness.tar.gz"
            self.send_response(200 if ok else 404)
            self.end_headers()
            self.wfile.write(archive if ok else b"")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_app_function_bootstraps_the_platforms_agent_and_returns_its_result(fake_modal, stand_in_platform):
    fake_modal.deploy("kernelbot", "run_h100", "runners.modal_app:run_h100")
    modal_backend = backend()
    dispatch = Dispatch(run_id=5, attempt=1, nonce="n0nce", platform_url=stand_in_platform + "/",
                        gpu_type=GpuType(name="H100"), gpu_count=1, timeout_s=60, label="kernelbot run 5",
                        token="attempt-5-1-token")
    call_id = modal_backend.dispatch(dispatch, NoReporter())
    fake_modal.wait(call_id)

    poll = modal_backend.poll(call_id)
    assert poll.state == RemoteState.FINISHED, poll.detail
    # the agent holds its attempt's token and no runner key
    assert (poll.result["verdict"], poll.result["token"], poll.result["key"]) == ("stand-in", "attempt-5-1-token", None)
    assert poll.result["argv"][:6] == ["--platform", stand_in_platform, "--run", "5", "--attempt", "1"]
    assert "/kernelbot-" in poll.result["agent"]  # the downloaded harness ran, not the one in this checkout

    failing = modal_backend.dispatch(Dispatch(**{**dispatch.__dict__, "run_id": 13}), NoReporter())
    fake_modal.wait(failing)
    poll = modal_backend.poll(failing)
    assert poll.state == RemoteState.FAILED and "exited with code 2 without a verdict" in poll.detail
