"""The Modal app an organiser deploys to run kernelbot on their Modal account: `modal deploy runners/modal_app.py`.

One function per GPU type (`run_h100`, `run_a100_80gb`, ...): Modal fixes the GPU per function. Each receives a run
id, attempt, the attempt's public nonce, the platform's URL and the attempt's token (the only credential the
container holds: it opens this attempt's routes while the attempt is current; no Modal secret is needed), fetches the
platform's own harness (`GET /api/runner/v1/harness.tar.gz`, so the harness always matches the platform, never the
deploy), and runs the agent, which fetches the job with that token, runs it sandboxed (required), and posts progress
and the result. The result is also the function's return value, so the platform's poll can read it from the
FunctionCall even if the agent's own post was lost.

Django-free on purpose: Modal imports this file alone in its containers. Stdlib and `modal` only.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

import modal

APP_NAME = "kernelbot"  # the pool's "app name" setting; `modal deploy --name` deploys under another
STALE_ATTEMPT = 3  # the agent's exit code when the platform has moved on from this attempt
FUNCTION_TIMEOUT_S = 3600  # a backstop: the harness enforces the run's own limits, the platform its deadlines

app = modal.App(APP_NAME)
image = (
    modal.Image.from_registry("nvidia/cuda:12.4.1-devel-ubuntu22.04", add_python="3.11")  # nvcc for .cu problems
    .apt_install("bubblewrap", "util-linux")  # the harness sandbox (bwrap, prlimit, setpriv)
    .pip_install("torch>=2.4", "numpy>=1.26", "ninja")
    # require: a container where the sandbox cannot work refuses the run instead of running submitted code beside
    # the agent and its token
    .env({"PYTHONUNBUFFERED": "1", "KERNELBOT_SANDBOX": "require"})
)
# retries=0: the platform retries a failed attempt itself, elsewhere too
options = dict(image=image, timeout=FUNCTION_TIMEOUT_S, retries=0)


def run_agent(run_id: int, attempt: int, nonce: str, platform_url: str, timeout_s: int = 0,
              token: str = "") -> dict | None:
    """Bootstrap the platform's harness into a fresh directory and run its agent for one attempt; returns the
    harness result. Raises when the agent could not deliver a verdict (an infrastructure failure)."""
    base = platform_url.rstrip("/")
    with tempfile.TemporaryDirectory(prefix="kernelbot-") as tmp:
        work = Path(tmp)
        with (urllib.request.urlopen(f"{base}/api/runner/v1/harness.tar.gz", timeout=60) as response,
              tarfile.open(fileobj=io.BytesIO(response.read()), mode="r:gz") as archive):
            archive.extractall(work, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))  # < 3.11.4
        result_file = work / "result.json"
        command = [sys.executable, "-m", "runners.harness.agent", "--platform", base, "--run", str(run_id),
                   "--attempt", str(attempt), "--result-file", str(result_file), "--workdir", tmp]
        env = {**os.environ, "PYTHONPATH": str(work), "KERNELBOT_ATTEMPT_TOKEN": token}
        try:  # the agent's output goes to this container's log (`modal app logs`), not into the platform
            code = subprocess.run(command, cwd=work, env=env, timeout=timeout_s + 120 if timeout_s else None).returncode
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the agent ran past the run's budget of {timeout_s} s") from None
        result = _read(result_file)  # written before the agent posts it: a lost post still returns the verdict
        if result is None and code == STALE_ATTEMPT:
            raise RuntimeError("the platform says this attempt is no longer current")
        if result is None:
            raise RuntimeError(f"the agent exited with code {code} without a verdict (see `modal app logs`)")
        return result


def _read(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


# One function per Modal GPU type; the pool maps a GPU type to its function (default `run_<type>`, e.g. A100-80GB →
# run_a100_80gb). A problem needing N GPUs on one machine needs a function with gpu="H100:N", mapped as "H100:N".
@app.function(gpu="T4", **options)
def run_t4(run_id: int, attempt: int, nonce: str, platform_url: str, timeout_s: int = 0,
           token: str = "") -> dict | None:
    return run_agent(run_id, attempt, nonce, platform_url, timeout_s, token)


@app.function(gpu="L4", **options)
def run_l4(run_id: int, attempt: int, nonce: str, platform_url: str, timeout_s: int = 0,
           token: str = "") -> dict | None:
    return run_agent(run_id, attempt, nonce, platform_url, timeout_s, token)


@app.function(gpu="A10G", **options)
def run_a10g(run_id: int, attempt: int, nonce: str, platform_url: str, timeout_s: int = 0,
             token: str = "") -> dict | None:
    return run_agent(run_id, attempt, nonce, platform_url, timeout_s, token)


@app.function(gpu="L40S", **options)
def run_l40s(run_id: int, attempt: int, nonce: str, platform_url: str, timeout_s: int = 0,
             token: str = "") -> dict | None:
    return run_agent(run_id, attempt, nonce, platform_url, timeout_s, token)


@app.function(gpu="A100-40GB", **options)
def run_a100(run_id: int, attempt: int, nonce: str, platform_url: str, timeout_s: int = 0,
             token: str = "") -> dict | None:
    return run_agent(run_id, attempt, nonce, platform_url, timeout_s, token)


@app.function(gpu="A100-80GB", **options)
def run_a100_80gb(run_id: int, attempt: int, nonce: str, platform_url: str, timeout_s: int = 0,
                  token: str = "") -> dict | None:
    return run_agent(run_id, attempt, nonce, platform_url, timeout_s, token)


@app.function(gpu="H100", **options)
def run_h100(run_id: int, attempt: int, nonce: str, platform_url: str, timeout_s: int = 0,
             token: str = "") -> dict | None:
    return run_agent(run_id, attempt, nonce, platform_url, timeout_s, token)


@app.function(gpu="H200", **options)
def run_h200(run_id: int, attempt: int, nonce: str, platform_url: str, timeout_s: int = 0,
             token: str = "") -> dict | None:
    return run_agent(run_id, attempt, nonce, platform_url, timeout_s, token)


@app.function(gpu="B200", **options)
def run_b200(run_id: int, attempt: int, nonce: str, platform_url: str, timeout_s: int = 0,
             token: str = "") -> dict | None:
    return run_agent(run_id, attempt, nonce, platform_url, timeout_s, token)
