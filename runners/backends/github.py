"""GitHub Actions: dispatch the workflow we ship (runners/github/kernelbot-run.yml) in the pool's runner repository.

The dispatch carries run id, attempt, nonce, platform URL and the attempt's token: the runner holds no long-lived
secret, the workflow masks the token in its logs, and inputs are visible only to the repository's writers. GitHub
names the workflow run in its answer to the dispatch, which becomes the external id; servers that refuse
`return_run_details` (older GitHub Enterprise) get `pending:<nonce>`, resolved on the next poll by the nonce the
workflow puts in its run name, so nothing waits. A signed `workflow_run` webhook (runners.webhooks) makes the
lifecycle poll at once on completion; `poll` reads the run and, once completed, the result artifact, which the
workflow encrypts with the attempt's token."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import re
import zipfile
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpx
from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from django import forms
from django.core.cache import cache
from github import Auth, Github, GithubException, RateLimitExceededException
from github.Repository import Repository
from github.WorkflowRun import WorkflowRun

from runners.harness.agent import runner_token
from runners.models import GpuType

from .base import BackendUnavailable, Dispatch, Poll, PoolOptions, RemoteState, Reporter, RunnerBackend, runner_key

log = logging.getLogger(__name__)

WORKFLOW = Path(__file__).resolve().parent.parent / "github" / "kernelbot-run.yml"
ARTIFACT = "kernelbot-result"
SEALED = "result.json.enc"
PENDING = "pending:"
MAX_ARTIFACT_BYTES = 32 << 20
RESOLVE_SCAN = 100  # newest dispatched runs searched for a pending id's nonce
TITLE = re.compile(r"kernelbot run (?P<run>\d+) attempt (?P<attempt>\d+) \[(?P<nonce>[A-Za-z0-9_-]+)\]$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CONFIG_STATUSES = {401, 403, 404, 422}  # the repository, workflow, ref, inputs or token are wrong: retrying won't help
QUEUED = {"queued", "requested", "waiting", "pending"}


def unseal(blob: bytes, password: str) -> bytes:
    """Decrypt `openssl enc -aes-256-cbc -pbkdf2 -iter 100000 -salt` output, as the workflow's seal step writes it."""
    if len(blob) < 32 or not blob.startswith(b"Salted__"):
        raise ValueError("not an openssl-sealed file")
    salt, body = blob[8:16], blob[16:]
    material = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, 100_000, 48)
    decryptor = Cipher(algorithms.AES(material[:32]), modes.CBC(material[32:])).decryptor()
    unpadder = padding.PKCS7(128).unpadder()
    return unpadder.update(decryptor.update(body) + decryptor.finalize()) + unpadder.finalize()


class GithubOptions(PoolOptions):
    repository = forms.RegexField(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$", help_text="The runner repository, owner/name.",
                                  error_messages={"invalid": "Enter the repository as owner/name."})
    workflow = forms.CharField(required=False, help_text="Workflow file name in .github/workflows "
                               "(default kernelbot-run.yml).")
    ref = forms.CharField(required=False, help_text="Branch or tag the workflow is dispatched on (default main).")
    runner_labels = forms.JSONField(help_text='GPU type → runner labels, e.g. {"H100": ["self-hosted", "h100"]}.')
    api_url = forms.URLField(required=False, assume_scheme="https", help_text="REST API base (default "
                             "https://api.github.com; GitHub Enterprise: https://HOST/api/v3).")
    token_env = forms.CharField(required=False, help_text="Environment variable holding the token that may "
                                "dispatch and cancel workflows and read artifacts (default GITHUB_TOKEN).")
    webhook_secret_env = forms.CharField(required=False, help_text="Environment variable holding the webhook "
                                         "secret (default GITHUB_WEBHOOK_SECRET).")

    DEFAULTS = {"workflow": "kernelbot-run.yml", "ref": "main", "api_url": "https://api.github.com",
                "token_env": "GITHUB_TOKEN", "webhook_secret_env": "GITHUB_WEBHOOK_SECRET"}

    def clean_runner_labels(self) -> dict[str, list[str]]:
        value = self.cleaned_data["runner_labels"]
        if not isinstance(value, dict) or not value:
            raise forms.ValidationError("Map each GPU type to its runner labels, e.g. {\"H100\": [\"self-hosted\"]}.")
        labels = {}
        for gpu, names in value.items():
            names = [names] if isinstance(names, str) else names
            if not isinstance(names, list) or not names or not all(isinstance(n, str) and n.strip() for n in names):
                raise forms.ValidationError(f"{gpu}: give a non-empty list of runner labels.")
            labels[gpu.strip()] = [n.strip() for n in names]
        return labels

    def clean(self) -> dict:
        data = super().clean()
        for field, default in self.DEFAULTS.items():
            if field not in self.errors:
                data[field] = (data.get(field) or default).strip()
        for field in ("token_env", "webhook_secret_env"):
            if data.get(field) and not ENV_NAME.match(data[field]):
                self.add_error(field, "Enter an environment variable name (letters, digits, underscores).")
        if data.get("api_url"):
            data["api_url"] = data["api_url"].rstrip("/")
        return data


class GithubBackend(RunnerBackend):
    options = GithubOptions

    @classmethod
    def available(cls) -> str | None:
        return None  # PyGithub and httpx are dependencies; a missing token is a pool's configuration error

    def secret(self, setting: str) -> str:
        name = self.settings[setting]
        value = os.environ.get(name, "")
        if not value:
            raise BackendUnavailable(f"GPU pool '{self.pool.name}': the environment variable {name} is not set")
        return value

    def key(self) -> str:
        if key := runner_key(self.pool):
            return key
        name = self.settings.get("runner_key_env") or "KERNELBOT_RUNNER_KEY"
        raise BackendUnavailable(f"GPU pool '{self.pool.name}': the runner key ({name}) is not set")

    def webhook_secret(self) -> str:
        return self.secret("webhook_secret_env")

    def repo(self) -> Repository:
        if not hasattr(self, "_repo"):
            client = Github(base_url=self.settings["api_url"], auth=Auth.Token(self.secret("token_env")), timeout=20,
                            retry=None, seconds_between_requests=0, seconds_between_writes=0, lazy=True)
            self._repo = client.get_repo(self.settings["repository"])
        return self._repo

    def labels(self, gpu_type: GpuType) -> list[str]:
        mapping = {name.lower(): labels for name, labels in self.settings["runner_labels"].items()}
        labels = mapping.get(gpu_type.name.lower())
        if labels is None:
            raise BackendUnavailable(f"GPU pool '{self.pool.name}' names no runner labels for {gpu_type.name}")
        return labels

    def dispatch(self, job: Dispatch, reporter: Reporter) -> str:
        inputs = {"run_id": str(job.run_id), "attempt": str(job.attempt), "nonce": job.nonce, "token": job.token,
                  "platform_url": job.platform_url, "runner_labels": json.dumps(self.labels(job.gpu_type)),
                  "timeout_minutes": str(math.ceil(job.timeout_s / 60) + 5)}  # + harness download and setup
        workflow = self.repo().get_workflow(self.settings["workflow"])
        ref = self.settings["ref"]
        try:
            try:
                return str(workflow.create_dispatch(ref, inputs, throw=True, return_run_details=True).id)
            except GithubException as exc:
                if exc.status != 400:
                    raise
                log.info("%s refused return_run_details (%s); dispatching without it", self.settings["api_url"],
                         _message(exc))
                workflow.create_dispatch(ref, inputs, throw=True)
                return PENDING + job.nonce
        except RateLimitExceededException:
            raise
        except GithubException as exc:
            if exc.status in CONFIG_STATUSES:
                raise BackendUnavailable(
                    f"GitHub refused to dispatch {self.settings['workflow']} on {self.settings['repository']}@{ref} "
                    f"({exc.status}: {_message(exc)}); check the pool's repository, workflow, ref and the token in "
                    f"{self.settings['token_env']}") from exc
            raise

    def find(self, external_id: str) -> WorkflowRun | None:
        """The workflow run behind an external id; None while a pending id's run is not listed yet."""
        if not external_id.startswith(PENDING):
            return self.repo().get_workflow_run(int(external_id))
        key = f"github:{self.pool.pk}:{external_id}"
        if run_id := cache.get(key):
            return self.repo().get_workflow_run(run_id)
        nonce = external_id.removeprefix(PENDING)
        runs = self.repo().get_workflow(self.settings["workflow"]).get_runs(event="workflow_dispatch")
        for index, run in enumerate(runs):
            if index >= RESOLVE_SCAN:
                break
            match = TITLE.search(run.display_title or "")
            if match and match["nonce"] == nonce:
                cache.set(key, run.id, 7 * 86400)
                return run
        return None

    def poll(self, external_id: str) -> Poll:
        try:
            run = self.find(external_id)
            if run is None:
                return Poll(RemoteState.QUEUED, "GitHub does not list the dispatched workflow run yet")
            status, conclusion = run.status, run.conclusion
        except GithubException as exc:
            if exc.status == 404:
                return Poll(RemoteState.LOST, f"GitHub no longer knows workflow run {external_id}")
            raise
        if status in QUEUED:
            return Poll(RemoteState.QUEUED, f"workflow run {status}: waiting for a runner with the pool's labels")
        if status != "completed":
            return Poll(RemoteState.RUNNING, f"workflow run {status}")
        if conclusion == "cancelled":
            return Poll(RemoteState.CANCELLED, "workflow run cancelled")
        result, missing = self.result(run)
        if result is not None:
            return Poll(RemoteState.FINISHED, f"workflow run {conclusion}", result)
        return Poll(RemoteState.FAILED, f"workflow run {conclusion} ({missing}): {run.html_url}")

    def result(self, run: WorkflowRun) -> tuple[dict | None, str]:
        """The harness result the workflow sealed into its artifact, or None and why not."""
        match = TITLE.search(run.display_title or "")
        if match is None:
            return None, f"run name {run.display_title!r} is not KernelBot's"
        artifact = next((a for a in run.get_artifacts() if a.name == ARTIFACT), None)
        if artifact is None:
            return None, "no result artifact"
        if artifact.expired:
            return None, "the result artifact expired"
        try:
            with zipfile.ZipFile(io.BytesIO(self.download(artifact.archive_download_url))) as archive:
                sealed = archive.read(SEALED)
            token = runner_token(self.key(), int(match["run"]), int(match["attempt"]), match["nonce"])
            result = json.loads(unseal(sealed, token))
        except (zipfile.BadZipFile, KeyError, ValueError) as exc:
            return None, f"unreadable result artifact: {exc}"
        if not isinstance(result, dict):
            return None, "the result artifact holds no result object"
        return result, ""

    def download(self, url: str) -> bytes:
        """GET an artifact zip with the token, following redirects by hand: the token goes only to the API's own
        origin, never to the blob storage GitHub redirects to."""
        api = urlsplit(self.settings["api_url"])
        token = self.secret("token_env")
        with httpx.Client(timeout=60, follow_redirects=False) as http:
            for _ in range(5):
                target = urlsplit(url)
                same_origin = (target.scheme, target.netloc) == (api.scheme, api.netloc)
                headers = {"Authorization": f"Bearer {token}"} if same_origin else {}
                with http.stream("GET", url, headers=headers) as resp:
                    if resp.is_redirect and "location" in resp.headers:
                        url = urljoin(url, resp.headers["location"])
                        continue
                    if resp.status_code in (404, 410):
                        raise ValueError(f"artifact download answered {resp.status_code}")
                    resp.raise_for_status()  # anything else may pass: the next poll tries again
                    body = bytearray()
                    for chunk in resp.iter_bytes():
                        body += chunk
                        if len(body) > MAX_ARTIFACT_BYTES:
                            raise ValueError("artifact larger than 32 MiB")
                    return bytes(body)
        raise ValueError("too many redirects downloading the artifact")

    def cancel(self, external_id: str) -> None:
        try:
            run = self.find(external_id)
            if run is None:
                log.warning("cannot cancel %s on %s: GitHub does not list it yet", external_id, self.pool.name)
                return
            run.cancel()
        except GithubException as exc:
            if exc.status not in (404, 409):  # gone, or already completed
                raise


def _message(exc: GithubException) -> str:
    data = exc.data if isinstance(exc.data, dict) else {}
    return str(data.get("message") or exc.data or "no message")[:300]
