"""A loopback fake of github.com's `GET /<login>.keys` (the user's public SSH keys, one per line, text/plain; 404 for
no such user), for `runners.reservations.keys` pointed at it with GITHUB_WEB_URL. `users[login]` holds the lines it
serves (logins are case-insensitive, as on GitHub); `status` answers every request with that code instead; `delay`
sleeps first (a slow GitHub); `requests` records the paths asked for."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeGithubKeys:
    def __init__(self) -> None:
        self.users: dict[str, list[str]] = {}
        self.status: int | None = None
        self.delay = 0.0
        self.requests: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                fake.requests.append(self.path)
                time.sleep(fake.delay)
                login = self.path[1:].removesuffix(".keys") if self.path.endswith(".keys") else None
                lines = {k.lower(): v for k, v in fake.users.items()}.get((login or "").lower())
                status = fake.status or (200 if lines is not None else 404)
                body = ("".join(f"{line}\n" for line in lines) if status == 200 else "Not Found").encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.handle_error = lambda request, address: None  # a client that timed out has hung up
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True, name="fake-github-keys").start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
