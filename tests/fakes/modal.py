"""A loopback stand-in for Modal's control plane: a grpclib server speaking `modal_proto`'s ModalClient service.

The unmodified `modal` client (pinned in pyproject.toml; this fake follows modal 1.6.4's calls) reaches it through
`MODAL_SERVER_URL=http://127.0.0.1:PORT`. It serves what `Function.from_name(...).spawn(...)`,
`FunctionCall.from_id(...).get(timeout=...)`, `.get_call_graph()` and `.cancel()` need: ClientHello, FunctionGet,
FunctionMap, FunctionGetOutputs, FunctionGetCallGraph and FunctionCallCancel, checking the token on each. Every
other method answers UNIMPLEMENTED, so a client change that needs more shows up as a clear error, not a hang.
Test switches: `pause_containers()` (calls stay queued), `hold()`/`release()` (answers wait: a Modal not
answering), `expire(call_id)` (outputs gone, as after Modal's retention).

A deployed function is registered as `(app, name) -> "module:attribute"`; a spawned call runs it the way a Modal
container would: in its own process (`tests.fakes.modal_exec`), with the app's secrets in its environment and the
pickled arguments on stdin; its pickled return value or exception becomes the call's output."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import secrets
import signal
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import empty_pb2
from grpclib import GRPCError, Status
from grpclib.server import Server, Stream
from modal_proto import api_grpc, api_pb2

REPO = Path(__file__).resolve().parents[2]
PICKLE = api_pb2.DATA_FORMAT_PICKLE


@dataclass
class Call:
    id: str
    function: Deployed
    input_id: str
    args: bytes
    done: asyncio.Event = field(default_factory=asyncio.Event)
    result: api_pb2.GenericResult | None = None
    expired: bool = False
    task_id: str = ""  # set once a "container" took the input
    started: asyncio.Event = field(default_factory=asyncio.Event)
    process: asyncio.subprocess.Process | None = None


@dataclass
class Deployed:
    id: str
    app: str
    name: str
    target: str  # "module:attribute" of the modal Function (or plain callable) to run
    environment: str


class _Servicer(api_grpc.ModalClientBase):
    def __init__(self, fake: FakeModal):
        self.fake = fake

    async def _receive(self, stream: Stream, name: str):
        request = await stream.recv_message()
        metadata = stream.metadata or {}
        if (metadata.get("x-modal-token-id"), metadata.get("x-modal-token-secret")) != (self.fake.token_id,
                                                                                      self.fake.token_secret):
            raise GRPCError(Status.UNAUTHENTICATED, "Token ID or secret is invalid")
        self.fake.requests.append((name, request))
        if self.fake.gate is not None:
            await self.fake.gate.wait()
        return request

    async def ClientHello(self, stream: Stream) -> None:
        await self._receive(stream, "ClientHello")
        await stream.send_message(api_pb2.ClientHelloResponse())

    async def FunctionGet(self, stream: Stream) -> None:
        request: api_pb2.FunctionGetRequest = await self._receive(stream, "FunctionGet")
        environment = request.environment_name or "main"
        if not any(f.app == request.app_name and f.environment == environment for f in self.fake.functions.values()):
            raise GRPCError(Status.NOT_FOUND, f"App '{request.app_name}' not found in environment '{environment}'")
        function = next((f for f in self.fake.functions.values() if (f.app, f.name, f.environment)
                         == (request.app_name, request.object_tag, environment)), None)
        if function is None:
            raise GRPCError(Status.NOT_FOUND, f"Function '{request.object_tag}' not found in app '{request.app_name}'")
        definition = api_pb2.Function(module_name=function.target.split(":")[0], function_name=function.name,
                                      function_type=api_pb2.Function.FUNCTION_TYPE_FUNCTION)
        await stream.send_message(api_pb2.FunctionGetResponse(
            function_id=function.id,
            handle_metadata=api_pb2.FunctionHandleMetadata(
                function_name=function.name, function_type=api_pb2.Function.FUNCTION_TYPE_FUNCTION,
                supported_input_formats=[PICKLE], supported_output_formats=[PICKLE], app_id=f"ap-{function.app}"),
            function=api_pb2.FunctionData(
                module_name=definition.module_name, function_name=function.name,
                ranked_functions=[api_pb2.FunctionData.RankedFunction(rank=0, function=definition)])))

    async def FunctionMap(self, stream: Stream) -> None:
        request: api_pb2.FunctionMapRequest = await self._receive(stream, "FunctionMap")
        function = next((f for f in self.fake.functions.values() if f.id == request.function_id), None)
        if function is None:
            raise GRPCError(Status.NOT_FOUND, f"Function {request.function_id} not found")
        if len(request.pipelined_inputs) != 1 or request.pipelined_inputs[0].input.data_format != PICKLE:
            raise GRPCError(Status.INVALID_ARGUMENT, "the fake takes one pipelined pickled input")
        call = Call(id=f"fc-{secrets.token_hex(11)}", function=function, input_id=f"in-{secrets.token_hex(11)}",
                    args=request.pipelined_inputs[0].input.args)
        self.fake.calls[call.id] = call
        self.fake.tasks.add(asyncio.get_running_loop().create_task(self.fake.execute(call)))
        await stream.send_message(api_pb2.FunctionMapResponse(
            function_call_id=call.id, function_call_jwt=f"jwt-{call.id}",
            pipelined_inputs=[api_pb2.FunctionPutInputsResponseItem(idx=0, input_id=call.input_id,
                                                                     input_jwt=f"jwt-{call.input_id}")]))

    async def FunctionGetOutputs(self, stream: Stream) -> None:
        request: api_pb2.FunctionGetOutputsRequest = await self._receive(stream, "FunctionGetOutputs")
        call = self.fake.calls.get(request.function_call_id)
        if call is None:
            raise GRPCError(Status.NOT_FOUND, f"Function call {request.function_call_id} not found")
        if request.timeout > 0 and not call.expired:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(call.done.wait(), request.timeout)
        if call.expired:  # Modal keeps outputs for a while; afterwards: no outputs and nothing unfinished
            await stream.send_message(api_pb2.FunctionGetOutputsResponse(num_unfinished_inputs=0))
        elif call.result is None:
            await stream.send_message(api_pb2.FunctionGetOutputsResponse(num_unfinished_inputs=1))
        else:
            await stream.send_message(api_pb2.FunctionGetOutputsResponse(
                idxs=[0], num_unfinished_inputs=0, outputs=[api_pb2.FunctionGetOutputsItem(
                    idx=0, input_id=call.input_id, result=call.result, data_format=PICKLE)]))

    async def FunctionGetCallGraph(self, stream: Stream) -> None:
        request: api_pb2.FunctionGetCallGraphRequest = await self._receive(stream, "FunctionGetCallGraph")
        call = self.fake.calls.get(request.function_call_id)
        if call is None:
            raise GRPCError(Status.NOT_FOUND, f"Function call {request.function_call_id} not found")
        await stream.send_message(api_pb2.FunctionGetCallGraphResponse(
            inputs=[api_pb2.InputCallGraphInfo(input_id=call.input_id, function_call_id=call.id, task_id=call.task_id,
                                               status=call.result.status if call.result else 0)],
            function_calls=[api_pb2.FunctionCallCallGraphInfo(function_call_id=call.id,
                                                              function_name=call.function.name,
                                                              module_name=call.function.target.split(":")[0])]))

    async def FunctionCallCancel(self, stream: Stream) -> None:
        request: api_pb2.FunctionCallCancelRequest = await self._receive(stream, "FunctionCallCancel")
        call = self.fake.calls.get(request.function_call_id)
        if call is None:
            raise GRPCError(Status.NOT_FOUND, f"Function call {request.function_call_id} not found")
        if call.result is None:
            call.result = api_pb2.GenericResult(status=api_pb2.GenericResult.GENERIC_STATUS_TERMINATED,
                                                exception="Function call was cancelled")
            if call.process is not None and call.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(call.process.pid, signal.SIGKILL)  # execute() sees the exit and sets done
            elif call.task_id == "":  # still queued
                call.done.set()
        await stream.send_message(empty_pb2.Empty())


def _unimplemented(name: str):
    async def handler(self, stream: Stream) -> None:
        raise GRPCError(Status.UNIMPLEMENTED, f"the Modal fake does not implement {name}")
    return handler


FakeModalServicer = type("FakeModalServicer", (_Servicer,), {
    name: _unimplemented(name) for name in _Servicer.__abstractmethods__})


class FakeModal:
    """Start with `with FakeModal() as modal:`; `modal.url` goes into MODAL_SERVER_URL."""

    def __init__(self, token_id: str = "ak-fake", token_secret: str = "as-fake", env: dict[str, str] | None = None):
        self.token_id, self.token_secret = token_id, token_secret
        self.env = env or {}  # the app's Modal secrets, as the function's container sees them
        self.capacity = asyncio.Event()  # cleared: spawned calls wait for a container (queued)
        self.capacity.set()
        self.gate: asyncio.Event | None = None  # while set up and closed, every answer waits (a Modal not answering)
        self.functions: dict[tuple[str, str, str], Deployed] = {}
        self.calls: dict[str, Call] = {}
        self.requests: list[tuple[str, object]] = []
        self.tasks: set[asyncio.Task] = set()
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="fake-modal", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def deploy(self, app: str, name: str, target: str, environment: str = "main") -> None:
        self.functions[(app, name, environment)] = Deployed(f"fu-{secrets.token_hex(11)}", app, name, target,
                                                            environment)

    def pause_containers(self) -> None:
        self.loop.call_soon_threadsafe(self.capacity.clear)

    def resume_containers(self) -> None:
        self.loop.call_soon_threadsafe(self.capacity.set)

    def wait_started(self, call_id: str, timeout: float = 30) -> None:
        asyncio.run_coroutine_threadsafe(asyncio.wait_for(self.calls[call_id].started.wait(), timeout),
                                         self.loop).result(timeout + 5)

    def hold(self) -> None:
        self.gate = asyncio.Event()

    def release(self) -> None:
        if self.gate is not None:
            self.loop.call_soon_threadsafe(self.gate.set)

    def expire(self, call_id: str) -> None:
        self.loop.call_soon_threadsafe(setattr, self.calls[call_id], "expired", True)

    def wait(self, call_id: str, timeout: float = 60) -> api_pb2.GenericResult:
        """Block until the call has an output (for tests that need the function to have finished)."""
        async def done() -> api_pb2.GenericResult:
            call = self.calls[call_id]
            await asyncio.wait_for(call.done.wait(), timeout)
            return call.result
        return asyncio.run_coroutine_threadsafe(done(), self.loop).result(timeout + 5)

    async def execute(self, call: Call) -> None:
        await self.capacity.wait()  # no container until there is capacity: the call stays queued
        if call.result is not None:  # cancelled before it started
            call.done.set()
            return
        call.task_id = f"ta-{secrets.token_hex(6)}"
        call.started.set()
        with tempfile.TemporaryDirectory(prefix="fake-modal-") as tmp:
            out = Path(tmp) / "output.pickle"
            env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8", "HOME": tmp,
                   "PYTHONPATH": str(REPO), "KERNELBOT_SANDBOX": os.environ.get("KERNELBOT_SANDBOX", ""),
                   "MODAL_TASK_ID": call.task_id, **self.env}
            call.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tests.fakes.modal_exec", call.function.target, str(out), cwd=tmp, env=env,
                stdin=asyncio.subprocess.PIPE, start_new_session=True)
            if call.result is not None:  # cancelled while the container started
                os.killpg(call.process.pid, signal.SIGKILL)
            await call.process.communicate(call.args)
            if call.result is not None:  # cancelled meanwhile
                call.done.set()
                return
            if out.exists():
                ok, payload, tb = pickle.loads(out.read_bytes())
                status = api_pb2.GenericResult.GENERIC_STATUS_SUCCESS if ok else \
                    api_pb2.GenericResult.GENERIC_STATUS_FAILURE
                call.result = api_pb2.GenericResult(status=status, data=pickle.dumps(payload),
                                                    exception="" if ok else repr(payload), traceback=tb)
            else:  # the container died without an output
                call.result = api_pb2.GenericResult(
                    status=api_pb2.GenericResult.GENERIC_STATUS_INTERNAL_FAILURE,
                    exception=f"container exited with code {call.process.returncode}")
            call.done.set()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = Server([FakeModalServicer(self)])
        self.loop.run_until_complete(self.server.start("127.0.0.1", 0))
        self.port = self.server._server.sockets[0].getsockname()[1]
        self._started.set()
        self.loop.run_forever()

    def __enter__(self) -> FakeModal:
        self._thread.start()
        self._started.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        async def shutdown() -> None:
            for call in self.calls.values():
                if call.process is not None and call.process.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(call.process.pid, signal.SIGKILL)
            for task in self.tasks:
                if not task.done() and not self.capacity.is_set():
                    task.cancel()  # still queued: no container will take it
            if self.tasks:
                await asyncio.wait(self.tasks, timeout=10)
            self.server.close()
            await self.server.wait_closed()
        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(20)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
