"""The remote agent: runs one attempt of a run on a remote machine and reports to the platform's runner API.

    KERNELBOT_ATTEMPT_TOKEN=… python -m runners.harness.agent --platform URL --run ID --attempt N
        [--result-file PATH] [--print-result]

Stdlib only, Django-free (bootstrap: `curl -fsS $URL/api/runner/v1/harness.tar.gz | tar xz`). Holds one credential:
the attempt's token, which the platform issued with the dispatch (HMAC-SHA256(key, "run:attempt:nonce"), computed by
the platform; the key never leaves it) and which opens only this attempt's routes while the attempt is current. It
refuses to start with the runner key in its environment. Fetches the job, writes the workdir, runs the harness parent
as a node agent does (runners.harness.runner: sandbox, result nonce), posts progress (heartbeats in between) and the
result, or a failure when it cannot run. Exits 0 when a verdict was delivered (whatever the verdict), 1 on an
infrastructure failure, 2 on bad usage; 3 when the platform says the attempt is no longer current (nothing to do).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import hmac
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

from .runner import Spares, new_workdir, run_harness, write_workdir

KEY_ENV = "KERNELBOT_RUNNER_KEY"  # the platform's (and a node agent's): never a remote runner's
TOKEN_ENV = "KERNELBOT_ATTEMPT_TOKEN"  # the one attempt's credential a remote runner holds
PR_SET_DUMPABLE = 4
HEARTBEAT_S = 20.0
RETRIES = 5


def runner_token(key: str, run_id: int, attempt: int, nonce: str) -> str:
    return hmac.new(key.encode(), f"{run_id}:{attempt}:{nonce}".encode(), hashlib.sha256).hexdigest()


def harden_self() -> None:
    """This process's /proc files (environ, mem) become unreadable to other processes of its uid."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


class Gone(Exception):
    """The platform says this attempt is no longer current (409)."""


class Refused(Exception):
    """The platform refused a call (a 4xx other than 409): retrying would not help."""

    def __init__(self, status: int, detail: str):
        super().__init__(f"HTTP {status}: {detail}")
        self.status, self.detail = status, detail


# method, URL, body, headers → status, body: urllib over the network; tests may route it elsewhere
Transport = Callable[[str, str, bytes | None, dict[str, str]], tuple[int, bytes]]


def http(method: str, url: str, data: bytes | None, headers: dict[str, str]) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def call(transport: Transport, url: str, token: str, body: dict | None = None, retries: int = RETRIES,
         pause: Callable[[float], object] = time.sleep) -> dict:
    """GET (no body) or POST JSON; retries connection errors and 5xx with backoff, raises Gone on 409 and Refused
    on any other 4xx. `pause` waits between tries: an Event's wait ends them early once it is set (a stopping agent
    does not back off for half a minute against a platform that is gone)."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    for attempt in range(retries):
        try:
            status, content = transport("GET" if data is None else "POST", url, data, headers)
        except OSError as exc:  # URLError is one
            if attempt == retries - 1:
                raise
            print(f"{url}: {exc}; retrying", file=sys.stderr)
        else:
            if status < 300:
                return json.loads(content or b"{}")
            detail = content.decode(errors="replace")[:500]
            if status == 409:
                raise Gone(detail)
            if status < 500 or attempt == retries - 1:
                raise Refused(status, detail)
        if pause(min(30.0, 0.5 * 2 ** attempt)):
            raise OSError(f"{url}: stopped while retrying")
    raise RuntimeError("unreachable")


class Platform:
    """One attempt's routes of the runner API."""

    def __init__(self, url: str, run_id: int, attempt: int, token: str, transport: Transport = http):
        self.base = f"{url.rstrip('/')}/api/runner/v1/runs/{run_id}/{attempt}/"
        self.token, self.transport = token, transport

    def call(self, route: str, body: dict | None = None, retries: int = RETRIES) -> dict:
        return call(self.transport, self.base + route, self.token, body, retries)


def placement() -> str:
    """Where the scheduler put this job, as the job route's query: the host and the physical device indices (Slurm's
    SLURM_JOB_GPUS, else CUDA_VISIBLE_DEVICES); the platform holds those devices for the run."""
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    gpus = os.environ.get("SLURM_JOB_GPUS") or os.environ.get("CUDA_VISIBLE_DEVICES") or ""
    indices = [g.strip() for g in gpus.split(",") if g.strip().isdigit()]
    return "?" + urllib.parse.urlencode({"host": host, "gpus": ",".join(indices)})


def visible_devices(count: int) -> list[str]:
    """The `count` devices this job may use: the scheduler's CUDA_VISIBLE_DEVICES when set, else the first ones."""
    if count <= 0:
        return []
    given = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return (given or [str(i) for i in range(count)])[:count]


def run_attempt(platform: Platform, workroot: Path, *, gpus: list[str] | None = None, job_extra: dict | None = None,
                python: str = sys.executable, heartbeat_s: float = HEARTBEAT_S, warm: bool = False,
                spares: Spares | None = None) -> dict:
    """Fetch and run one attempt, reporting progress; returns its result (raises on infrastructure failure).
    `gpus`: the devices to use (default: the scheduler's, `visible_devices`); `job_extra`: the node's per-device
    settings (limits are merged into the job's); `warm`: fork the harness parent from this process's template;
    `spares`: take the slot's spare if there is one, and leave the next one when the run ends (implies warm)."""
    payload = platform.call("job" + placement())
    gpus = visible_devices(int(payload.get("gpu_count", 0))) if gpus is None else gpus
    spare = spares.take(tuple(gpus)) if spares is not None else None
    workdir = spare.workdir if spare is not None else new_workdir(workroot)
    lock = threading.Lock()
    wanted = {"alive": True, "last": time.monotonic()}

    def post_progress(event: dict) -> None:
        with lock:
            try:
                platform.call("progress", event, retries=2)
                wanted["last"] = time.monotonic()
            except Gone:
                wanted["alive"] = False
            except Exception as exc:  # a lost progress post is not fatal; the heartbeat retries
                print(f"progress post failed: {exc}", file=sys.stderr)

    def still_wanted() -> bool:
        if time.monotonic() - wanted["last"] >= heartbeat_s:
            post_progress({"heartbeat": True})
        return wanted["alive"]

    extra = job_extra or {}
    job = {**payload["job"], **extra, "limits": {**payload["job"].get("limits", {}), **extra.get("limits", {})},
           "workdir": str(workdir), "gpus": gpus}
    try:
        write_workdir(workdir, payload["files"])
        result, failure = run_harness(job, python=python, pythonpath=str(Path(__file__).resolve().parents[2]),
                                      timeout=float(payload["timeout_s"]), on_progress=post_progress,
                                      still_wanted=still_wanted, check_interval=min(2.0, heartbeat_s),
                                      warm=warm or spares is not None, proc=spare.proc if spare else None)
    finally:
        if spare is not None and spare.proc.poll() is None:  # never got its job (bad files): it must not linger
            Spares.discard(spare)
        shutil.rmtree(workdir.parent, ignore_errors=True)
        if spares is not None:
            spares.prepare(tuple(gpus), job)
    if not wanted["alive"]:
        raise Gone("the platform stopped the attempt")
    if result is None:
        raise RuntimeError(failure or "the harness ended without a result")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runners.harness.agent", description=__doc__.split("\n\n")[0])
    parser.add_argument("--platform", required=True, help="the platform's URL, e.g. https://kernelbot.example.org")
    parser.add_argument("--run", type=int, required=True)
    parser.add_argument("--attempt", type=int, required=True)
    parser.add_argument("--result-file", type=Path, help="also write the result JSON here")
    parser.add_argument("--print-result", action="store_true", help="print the result JSON as the last stdout line")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()), help="where to unpack the job")
    args = parser.parse_args(argv)
    if os.environ.get(KEY_ENV):
        print(f"{KEY_ENV} is set: a remote runner must not hold the platform's key (it would open every run's "
              f"routes); give it only the attempt's {TOKEN_ENV}", file=sys.stderr)
        return 2
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        print(f"{TOKEN_ENV} is not set (the dispatch carries it)", file=sys.stderr)
        return 2
    harden_self()
    platform = Platform(args.platform, args.run, args.attempt, token)
    try:
        result = run_attempt(platform, args.workdir)
        text = json.dumps(result)  # handed back through the service too, before the post that may fail
        if args.result_file:
            args.result_file.write_text(text)
        if args.print_result:
            print(text, flush=True)
        platform.call("result", result)
    except Gone as exc:
        print(f"attempt no longer current: {exc}", file=sys.stderr)
        return 3
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        print(f"infrastructure failure: {reason}", file=sys.stderr)
        try:
            platform.call("failure", {"reason": reason[:2000]}, retries=3)
        except Exception as report_exc:
            print(f"could not report the failure: {report_exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
