"""A loopback fake of the GitHub REST routes the GitHub backend calls through PyGithub, unmodified.

It runs a dispatched workflow the way a GitHub runner would: it reads the workflow file (ours, by default),
evaluates the `${{ }}` expressions it uses (inputs, secrets, vars, runner.temp, fromJSON, ||, always()), runs each
`run:` step with bash, emulates `actions/upload-artifact`, and on completion sends the signed `workflow_run` webhook.
A run waits, queued, until a runner with all its `runs-on` labels is online (`runner_labels`). Artifact zips are
served through a redirect to a second loopback "blob" server that records any Authorization header it is sent
(`violations`): the token must never leave the API's origin."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import io
import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import uuid
import zipfile
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import yaml

from runners.backends.github import WORKFLOW

EXPRESSION = re.compile(r"\$\{\{(.*?)\}\}", re.S)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeGithub:
    def __init__(self, token: str = "gh-fake-token", workflow: Path = WORKFLOW):
        self.token = token
        self.workflow_file = workflow
        self.workflow = yaml.safe_load(workflow.read_text())
        self.repos: dict[str, dict[str, int]] = {}  # full name -> {workflow file: workflow id}
        self.runs: dict[int, dict] = {}
        self.artifacts: dict[int, dict] = {}
        self.runner_labels: list[set[str]] = []  # the label sets of the runners online
        self.secrets: dict[str, str] = {}
        self.vars: dict[str, str] = {}
        self.env: dict[str, str] = {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8"}
        self.webhook: tuple[str, str] | None = None  # (url, secret)
        self.webhook_answers: list[int] = []
        self.dispatch_status: int | None = None  # answer every dispatch with this error status
        self.run_details = True  # False: answer 400 to return_run_details, as older GitHub Enterprise does
        self.keep_artifacts = True  # False: the artifact upload silently stores nothing
        self.violations: list[str] = []
        self.requests: list[str] = []
        self.lock = threading.Lock()
        self._ids = iter(range(7001, 10**9))
        self._dir = tempfile.TemporaryDirectory(prefix="fake-github-")
        self.api = self._serve(self._api_handler())
        self.blob = self._serve(self._blob_handler())
        self.api_url = f"http://127.0.0.1:{self.api.server_port}/api/v3"
        self.blob_url = f"http://127.0.0.1:{self.blob.server_port}"
        self._threads: list[threading.Thread] = []

    # -- lifecycle --------------------------------------------------------------------------------------------
    @staticmethod
    def _serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    def close(self) -> None:
        with self.lock:
            runs = list(self.runs.values())
        for run in runs:
            self._kill(run)
        for thread in self._threads:
            thread.join(timeout=10)
        self.api.shutdown()
        self.blob.shutdown()
        self._dir.cleanup()

    def add_repo(self, full_name: str, workflow: str = "kernelbot-run.yml") -> None:
        self.repos.setdefault(full_name, {})[workflow] = next(self._ids)

    def wait(self, run_id: int, timeout: float = 60) -> dict:
        """Block until the run completed and its webhook (if any) was sent."""
        run = self.runs[run_id]
        if not run["done"].wait(timeout):
            raise TimeoutError(f"fake workflow run {run_id} did not complete in {timeout} s")
        return run

    # -- JSON shapes ------------------------------------------------------------------------------------------
    def _repo_json(self, full: str) -> dict:
        owner, name = full.split("/")
        return {"id": abs(hash(full)) % 10**6, "name": name, "full_name": full, "owner": {"login": owner},
                "url": f"{self.api_url}/repos/{full}", "html_url": f"https://github.invalid/{full}"}

    def _workflow_json(self, full: str, file: str) -> dict:
        wid = self.repos[full][file]
        return {"id": wid, "name": self.workflow.get("name", file), "path": f".github/workflows/{file}",
                "state": "active", "url": f"{self.api_url}/repos/{full}/actions/workflows/{wid}",
                "html_url": f"https://github.invalid/{full}/actions/workflows/{file}"}

    def _run_json(self, run: dict) -> dict:
        base = f"{self.api_url}/repos/{run['repo']}/actions/runs/{run['id']}"
        return {"id": run["id"], "name": self.workflow.get("name"), "display_title": run["title"],
                "status": run["status"], "conclusion": run["conclusion"], "event": "workflow_dispatch",
                "workflow_id": run["workflow_id"], "run_attempt": 1, "url": base, "artifacts_url": f"{base}/artifacts",
                "cancel_url": f"{base}/cancel", "html_url": f"https://github.invalid/{run['repo']}/actions/runs/"
                f"{run['id']}", "created_at": run["created_at"], "updated_at": _now(),
                "repository": self._repo_json(run["repo"])}

    def _artifact_json(self, artifact: dict) -> dict:
        url = f"{self.api_url}/repos/{artifact['repo']}/actions/artifacts/{artifact['id']}"
        return {"id": artifact["id"], "name": artifact["name"], "size_in_bytes": len(artifact["data"]),
                "expired": artifact.get("expired", False), "url": url, "archive_download_url": f"{url}/zip",
                "created_at": _now()}

    # -- HTTP -------------------------------------------------------------------------------------------------
    def _api_handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def answer(self, status: int, body: Any = None, headers: dict | None = None) -> None:
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                for key, value in {"Content-Type": "application/json", **(headers or {})}.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def handle_any(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                url = urlsplit(self.path)
                fake.requests.append(f"{method} {url.path}")
                auth = self.headers.get("Authorization", "")
                if auth not in (f"token {fake.token}", f"Bearer {fake.token}"):
                    return self.answer(401, {"message": "Bad credentials"})
                path = url.path.removeprefix("/api/v3")
                try:
                    status, payload, headers = fake.route(method, path, parse_qs(url.query),
                                                          json.loads(body) if body else None)
                except LookupError:
                    status, payload, headers = 404, {"message": "Not Found"}, None
                self.answer(status, payload, headers)

            def do_GET(self) -> None:  # noqa: N802
                self.handle_any("GET")

            def do_POST(self) -> None:  # noqa: N802
                self.handle_any("POST")

        return Handler

    def _blob_handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                if "Authorization" in self.headers:
                    fake.violations.append(f"blob storage received Authorization on {self.path}")
                    self.send_response(400)
                    self.end_headers()
                    return
                artifact = fake.artifacts.get(int(self.path.rsplit("/", 1)[-1]))
                data = artifact["data"] if artifact else b""
                self.send_response(200 if artifact else 404)
                self.send_header("Content-Type", "application/zip")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler

    def route(self, method: str, path: str, query: dict, body: Any) -> tuple[int, Any, dict | None]:
        parts = path.strip("/").split("/")
        if parts[0] != "repos" or len(parts) < 3:
            raise LookupError
        full = f"{parts[1]}/{parts[2]}"
        if full not in self.repos:
            raise LookupError
        rest = parts[3:]
        if not rest and method == "GET":
            return 200, self._repo_json(full), None
        if rest[:2] == ["actions", "workflows"] and len(rest) >= 3:
            file = self._workflow_file(full, rest[2])
            if len(rest) == 3 and method == "GET":
                return 200, self._workflow_json(full, file), None
            if rest[3:] == ["dispatches"] and method == "POST":
                return self.dispatch(full, file, body or {})
            if rest[3:] == ["runs"] and method == "GET":
                runs = [self._run_json(r) for r in sorted(self.runs.values(), key=lambda r: -r["id"])
                        if r["repo"] == full and (not query.get("event") or query["event"][0] == "workflow_dispatch")]
                return 200, {"total_count": len(runs), "workflow_runs": runs}, None
        if rest[:2] == ["actions", "runs"] and len(rest) >= 3:
            run = self.runs.get(int(rest[2])) if rest[2].isdigit() else None
            if run is None or run["repo"] != full:
                raise LookupError
            if len(rest) == 3 and method == "GET":
                return 200, self._run_json(run), None
            if rest[3:] == ["cancel"] and method == "POST":
                return self.cancel(run)
            if rest[3:] == ["artifacts"] and method == "GET":
                items = [self._artifact_json(a) for a in self.artifacts.values() if a["run"] == run["id"]]
                return 200, {"total_count": len(items), "artifacts": items}, None
        if rest[:2] == ["actions", "artifacts"] and rest[3:] == ["zip"] and method == "GET":
            artifact = self.artifacts.get(int(rest[2])) if rest[2].isdigit() else None
            if artifact is None or artifact.get("expired"):
                return (410, {"message": "Artifact has expired"}, None) if artifact else (404, {"message": "Not Found"},
                                                                                         None)
            return 302, None, {"Location": f"{self.blob_url}/blob/{artifact['id']}"}
        raise LookupError

    def _workflow_file(self, full: str, ref: str) -> str:
        for file, wid in self.repos[full].items():
            if ref in (file, str(wid)):
                return file
        raise LookupError

    # -- workflow runs ----------------------------------------------------------------------------------------
    def dispatch(self, full: str, file: str, body: dict) -> tuple[int, Any, dict | None]:
        if self.dispatch_status:
            return self.dispatch_status, {"message": f"fake refusal {self.dispatch_status}"}, None
        if body.get("return_run_details") and not self.run_details:
            return 400, {"message": 'Invalid request.\n\n"return_run_details" is not a permitted key.'}, None
        declared = self.workflow[True if True in self.workflow else "on"]["workflow_dispatch"]["inputs"]
        inputs = body.get("inputs") or {}
        if unexpected := sorted(set(inputs) - set(declared)):
            return 422, {"message": f"Unexpected inputs provided: {unexpected}"}, None
        if len(inputs) > 25:
            return 422, {"message": "you may only define up to 25 `inputs` for a `workflow_dispatch` event"}, None
        for name, spec in declared.items():
            if spec.get("required") and name not in inputs:
                return 422, {"message": f"Required input '{name}' not provided"}, None
            inputs.setdefault(name, spec.get("default", ""))
        if not body.get("ref"):
            return 422, {"message": "Invalid value for parameter 'ref'"}, None
        run_id = next(self._ids)
        context = {"inputs": inputs, "vars": self.vars}
        run = {"id": run_id, "repo": full, "workflow_id": self.repos[full][file], "inputs": inputs,
               "title": self.expand(self.workflow.get("run-name", ""), context), "status": "queued",
               "conclusion": None, "created_at": _now(), "log": [], "proc": None, "cancelled": False,
               "done": threading.Event()}
        with self.lock:
            self.runs[run_id] = run
        thread = threading.Thread(target=self._execute, args=(run,), daemon=True)
        self._threads.append(thread)
        thread.start()
        if body.get("return_run_details"):
            base = f"{self.api_url}/repos/{full}/actions/runs/{run_id}"
            return 200, {"workflow_run_id": run_id, "run_url": base,
                         "html_url": f"https://github.invalid/{full}/actions/runs/{run_id}"}, None
        return 204, None, None

    def cancel(self, run: dict) -> tuple[int, Any, dict | None]:
        with self.lock:
            if run["status"] == "completed":
                return 409, {"message": "Cannot cancel a workflow run that is completed."}, None
            run["cancelled"] = True
        self._kill(run)
        return 202, {}, None

    def _kill(self, run: dict) -> None:
        run["cancelled"] = run["cancelled"] or run["status"] != "completed"
        proc = run.get("proc")
        if proc and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    def _execute(self, run: dict) -> None:
        try:
            self._steps(run)
        except Exception as exc:  # a workflow GitHub could not run: it reports a startup failure
            run["log"].append(("startup", -1, f"{type(exc).__name__}: {exc}"))
            self._complete(run, "startup_failure")

    def _steps(self, run: dict) -> None:
        job = next(iter(self.workflow["jobs"].values()))
        temp = Path(self._dir.name) / f"run-{run['id']}"
        workspace = temp / "workspace"
        workspace.mkdir(parents=True)
        context = {"inputs": run["inputs"], "secrets": self.secrets, "vars": self.vars,
                   "runner": {"temp": str(temp)}, "github": {"workspace": str(workspace)}}
        # what the job-level keys may use (GitHub's context availability): no `runner` before a runner has the job
        job_context = {k: v for k, v in context.items() if k != "runner"}
        labels = self.expand(job["runs-on"], job_context)
        labels = {labels} if isinstance(labels, str) else set(labels)
        while not any(labels <= online for online in self.runner_labels):  # no runner ever picks it up
            if run["cancelled"]:
                return self._complete(run, "cancelled")
            if run["done"].wait(0.05):
                return
        run["status"] = "in_progress"
        limit = float(self.expand(job.get("timeout-minutes", 360), job_context)) * 60
        env = {**self.env, "HOME": str(workspace), "RUNNER_TEMP": str(temp), "GITHUB_WORKSPACE": str(workspace),
               **{k: str(self.expand(v, job_context)) for k, v in (job.get("env") or {}).items()}}
        failed = timed_out = False
        for step in job["steps"]:
            condition = step.get("if")
            if run["cancelled"] or not (self.expand(f"${{{{ {condition} }}}}", context) if condition else not failed):
                continue
            if "run" in step:
                step_env = {**env, **{k: str(self.expand(v, context)) for k, v in (step.get("env") or {}).items()}}
                cwd = self.expand(step.get("working-directory", str(workspace)), context)
                proc = subprocess.Popen(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c",
                                         self.expand(step["run"], context)], cwd=cwd, env=step_env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
                run["proc"] = proc
                try:
                    out, _ = proc.communicate(timeout=limit)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    out, _ = proc.communicate()
                    timed_out = True
                shown = self._masked(run, out.decode(errors="replace"))
                run["log"].append((step.get("name", ""), proc.returncode, shown))
                failed = failed or proc.returncode != 0
            elif step.get("uses", "").startswith("actions/upload-artifact@"):
                spec = {k: self.expand(str(v), context) for k, v in (step.get("with") or {}).items()}
                self._upload(run, spec)
        conclusion = ("cancelled" if run["cancelled"] else "timed_out" if timed_out
                      else "failure" if failed else "success")
        self._complete(run, conclusion)

    def _upload(self, run: dict, spec: dict) -> None:
        source = Path(spec["path"])
        if not source.is_file() or not self.keep_artifacts:
            return
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            archive.write(source, source.name)
        artifact_id = next(self._ids)
        self.artifacts[artifact_id] = {"id": artifact_id, "run": run["id"], "repo": run["repo"],
                                       "name": spec["name"], "data": buffer.getvalue()}

    def _complete(self, run: dict, conclusion: str) -> None:
        with self.lock:
            run["status"], run["conclusion"] = "completed", conclusion
        if self.webhook:
            url, secret = self.webhook
            body = json.dumps({"action": "completed", "workflow_run": self._run_json(run),
                               "repository": self._repo_json(run["repo"])}).encode()
            signature = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
            try:
                answer = httpx.post(url, content=body, timeout=30, headers={
                    "Content-Type": "application/json", "X-GitHub-Event": "workflow_run",
                    "X-GitHub-Delivery": str(uuid.uuid4()), "X-Hub-Signature-256": signature})
                self.webhook_answers.append(answer.status_code)
            except httpx.HTTPError as exc:
                self.webhook_answers.append(0)
                run["log"].append(("webhook", -1, str(exc)))
        run["done"].set()

    @staticmethod
    def _masked(run: dict, text: str) -> str:
        """The log as GitHub keeps it: `::add-mask::VALUE` commands are not shown, and each VALUE shows as ***."""
        masks = run.setdefault("masks", set())
        kept = []
        for line in text.splitlines(keepends=True):
            if line.startswith("::add-mask::"):
                masks.add(line.removeprefix("::add-mask::").strip())
            else:
                kept.append(line)
        text = "".join(kept)
        for value in filter(None, masks):
            text = text.replace(value, "***")
        return text

    # -- expressions ------------------------------------------------------------------------------------------
    def expand(self, value: Any, context: dict) -> Any:
        """Substitute `${{ }}` expressions; a value that is one whole expression keeps its type (runs-on lists)."""
        if not isinstance(value, str):
            return value
        whole = EXPRESSION.fullmatch(value.strip())
        if whole:
            return self.evaluate(whole[1], context)
        return EXPRESSION.sub(lambda m: str(self.evaluate(m[1], context)), value)

    def evaluate(self, expr: str, context: dict) -> Any:
        value: Any = ""
        for alternative in expr.split("||"):
            value = self._atom(alternative.strip(), context)
            if value:
                return value
        return value

    def _atom(self, atom: str, context: dict) -> Any:
        if (root := atom.split(".")[0]) in {"inputs", "secrets", "vars", "runner", "github"} and root not in context:
            raise ValueError(f"the {root} context is not available here: ${{{{ {atom} }}}}")
        if atom == "always()":
            return True
        if atom.startswith("'") and atom.endswith("'"):
            return atom[1:-1]
        if call := re.fullmatch(r"fromJSON\((.*)\)", atom):
            return json.loads(self._atom(call[1].strip(), context))
        value: Any = context
        for key in atom.split("."):
            value = value.get(key, "") if isinstance(value, dict) else ""
        return value
