"""KernelBot's pre-check, as a second opinion: `kernelguard` (gpu-mode's rule-based hack detector, the one KernelBot
runs before queueing a ranked submission) reads the source of every ranked submission here too. Its findings are
stored on the submission (`Submission.precheck`) and shown to organisers beside the harness's verdict
(`access.authority.may_see_precheck`); by default they do not block, since the harness's own defences decide the
verdict. `KERNELBOT_KERNELGUARD_BLOCK=1` refuses what kernelguard would filter, as KernelBot does.

It runs as KernelBot runs it: its CLI in `--api-mode` (source on stdin, one JSON object out) in a child process
under a timeout, so a pathological file costs the request at most `KERNELGUARD_TIMEOUT_S`. When it crashes or
times out the submission proceeds with the failure recorded (`KERNELBOT_KERNELGUARD_FAIL_OPEN=1`, the default)
or is refused (`=0`)."""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import logging
import os
import subprocess
import sys
import time
from typing import Any

from django.conf import settings

from .errors import SubmissionRejected
from .models import SubmissionMode

log = logging.getLogger(__name__)

TOOL = "kernelguard"
GUARDED_MODES = frozenset({SubmissionMode.LEADERBOARD})
MAX_FINDINGS = 50  # kept per submission; kernelguard reports a handful
MAX_EVIDENCE = 500  # characters of each finding's evidence


class PrecheckFailed(Exception):
    """kernelguard could not give an answer (crashed, timed out, printed no JSON)."""


@functools.cache
def installed_version() -> str | None:
    """kernelguard's version in this interpreter, or None when it is not installed (the pre-check is then off)."""
    if importlib.util.find_spec(TOOL) is None:
        return None
    try:
        return importlib.metadata.version(TOOL)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def enabled() -> bool:
    return settings.KERNELGUARD_ENABLED and installed_version() is not None


def analyze(code: str) -> dict[str, Any]:
    """kernelguard's raw result for `code` (its `--api-mode` JSON), or PrecheckFailed."""
    command = [sys.executable, "-I", "-m", TOOL, "--api-mode"]
    if settings.KERNELGUARD_PROFILE:
        command += ["--profile", settings.KERNELGUARD_PROFILE]
    try:
        # -I and a bare environment: no PYTHON* variables, no module shadowing from the working directory, and
        # none of this process's secrets in the child's environment
        proc = subprocess.run(command, input=code, capture_output=True, text=True, check=False,
                              timeout=settings.KERNELGUARD_TIMEOUT_S,
                              env={"PATH": os.environ.get("PATH", ""), "LC_ALL": "C.UTF-8"})
    except subprocess.TimeoutExpired as exc:
        raise PrecheckFailed(f"timed out after {settings.KERNELGUARD_TIMEOUT_S:g} s") from exc
    except OSError as exc:
        raise PrecheckFailed(f"could not start: {exc}") from exc
    if proc.returncode != 0:
        last_line = (proc.stderr.strip().splitlines() or [""])[-1]  # a traceback's or argparse's message
        raise PrecheckFailed(f"exited with status {proc.returncode}: {last_line[:300]}")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    try:
        result = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError) as exc:
        raise PrecheckFailed(f"printed no JSON result: {proc.stdout.strip()[-300:]!r}") from exc
    if not isinstance(result, dict):
        raise PrecheckFailed("printed a JSON value that is not an object")
    return result


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """What the submission keeps of kernelguard's result: its verdict and its findings, bounded."""
    findings = [
        {"pattern": str(item.get("pattern", "unknown")), "severity": str(item.get("severity", "")),
         "evidence": str(item.get("evidence", ""))[:MAX_EVIDENCE]}
        for item in result.get("matched_patterns") or [] if isinstance(item, dict)]
    return {"classification": str(result.get("classification", "unknown")),
            "should_filter": bool(result.get("should_filter")),
            "filter_reason": result.get("filter_reason"),
            "findings": findings[:MAX_FINDINGS]}


def check_precheck(mode: str, file_name: str, code: str) -> dict[str, Any]:
    """Runs kernelguard on a ranked submission's source when it is enabled and installed; returns what to store
    on the submission (`{}` when it did not run). Raises SubmissionRejected when blocking is on and kernelguard
    would filter the file, or when it fails and the pre-check fails closed."""
    if mode not in GUARDED_MODES or not enabled():
        return {}
    record: dict[str, Any] = {"tool": TOOL, "version": installed_version()}
    started = time.monotonic()
    try:
        record |= summary(analyze(code))
    except PrecheckFailed as exc:
        log.warning("kernelguard pre-check of %r failed: %s", file_name, exc)
        if not settings.KERNELGUARD_FAIL_OPEN:
            raise SubmissionRejected(
                f"The KernelGuard pre-check could not check '{file_name}' ({exc}), and this server does not accept "
                "unchecked ranked submissions; submit again later, or ask the organisers.", 422) from exc
        record["error"] = str(exc)
    record["seconds"] = round(time.monotonic() - started, 3)
    if record.get("should_filter") and settings.KERNELGUARD_BLOCK:
        rules = ", ".join(sorted({finding["pattern"] for finding in record["findings"]}))
        raise SubmissionRejected(
            f"Submission rejected by KernelGuard pre-check ({record['filter_reason'] or record['classification']})"
            + (f". Matched rules: {rules}." if rules else "."), 400)
    if record.get("findings"):
        log.info("kernelguard classified %r as %s", file_name, record["classification"])
    return record
