"""A loopback fake of the Hugging Face Hub routes `huggingface_hub.HfApi` calls to create a dataset repository and
upload a file in one commit, unmodified (point it at the fake with `HfApi(endpoint=…)` / HF_ENDPOINT):

- `POST /api/repos/create` ({"name", "organization", "type"}) → {"url"}; 409 when it exists (exist_ok accepts it).
- `POST /api/{type}s/{owner}/{name}/preupload/{revision}` ({"files": [{"path", "size", "sample"}]}) → every file
  "regular" (the Hub decides; regular files travel inside the commit, not through LFS or Xet storage).
- `GET /api/datasets/{owner}/{name}` → {"id", "private"} (`HfApi.dataset_info`).
- `POST /api/{type}s/{owner}/{name}/commit/{revision}`: ndjson lines {"key": "header", "value": {"summary", …}} and
  {"key": "file", "value": {"path", "content", "encoding": "base64"}} → {"commitUrl", "commitOid"}.

Every call must carry `Authorization: Bearer <token>`; others get 401. The fake keeps each repository's files
(`repos[(type, id)][path] = bytes`) and its commits, for the test to read back."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


class FakeHub:
    def __init__(self, token: str):
        self.token = token
        self.repos: dict[tuple[str, str], dict[str, bytes]] = {}
        self.commits: list[dict] = []
        self.private: dict[tuple[str, str], bool] = {}  # how each repository was created (the Hub's default: public)
        self.refused: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Authorization") != f"Bearer {hub.token}":
                    hub.refused.append(self.path)
                    return self.reply(401, {"error": "Invalid credentials in Authorization header"})
                status, answer = hub.route(urlsplit(self.path).path, body)
                self.reply(status, answer)

            def do_GET(self) -> None:  # noqa: N802 - `HfApi.dataset_info`: GET /api/datasets/{owner}/{name}
                if self.headers.get("Authorization") != f"Bearer {hub.token}":
                    hub.refused.append(self.path)
                    return self.reply(401, {"error": "Invalid credentials in Authorization header"})
                parts = [unquote(p) for p in urlsplit(self.path).path.split("/")]
                key = ("dataset", "/".join(parts[3:5]))
                if parts[1:3] != ["api", "datasets"] or key not in hub.repos:
                    return self.reply(404, {"error": "Repository not found"})
                self.reply(200, {"id": key[1], "private": hub.private[key], "sha": "0" * 40})

            def reply(self, status: int, answer: dict) -> None:
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="fake-hub")

    def start(self) -> FakeHub:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def route(self, path: str, body: bytes) -> tuple[int, dict]:
        if path == "/api/repos/create":
            request = json.loads(body)
            repo_id = f"{request.get('organization') or 'me'}/{request['name']}"
            key = (request.get("type") or "model", repo_id)
            if key in self.repos:
                return 409, {"error": "You already created this dataset repo", "url": self._url(*key)}
            self.repos[key] = {}
            shown = request.get("visibility", "private" if request.get("private") else "public")
            self.private[key] = shown == "private"
            return 200, {"url": self._url(*key)}
        parts = [unquote(p) for p in path.split("/")]  # "", api, datasets, owner, name, verb, revision
        if len(parts) != 7 or parts[1] != "api" or parts[5] not in ("preupload", "commit"):
            return 404, {"error": f"no route {path}"}
        key = (parts[2].removesuffix("s"), f"{parts[3]}/{parts[4]}")
        if key not in self.repos:
            return 404, {"error": "Repository not found"}
        if parts[5] == "preupload":
            files = json.loads(body)["files"]
            return 200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                   for f in files]}
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        header = next(line["value"] for line in lines if line["key"] == "header")
        files = {line["value"]["path"]: base64.b64decode(line["value"]["content"])
                 for line in lines if line["key"] == "file"}
        self.repos[key].update(files)
        oid = hashlib.sha1(json.dumps([header, sorted(files)]).encode() + b"".join(files.values())).hexdigest()  # noqa: S324
        self.commits.append({"repo": key, "summary": header.get("summary"), "files": sorted(files), "oid": oid})
        return 200, {"commitUrl": f"{self._url(*key)}/commit/{oid}", "commitOid": oid}

    def _url(self, repo_type: str, repo_id: str) -> str:
        return f"{self.url}/{'' if repo_type == 'model' else repo_type + 's/'}{repo_id}"
