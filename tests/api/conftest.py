from __future__ import annotations

import json
import uuid

import pytest

from leaderboards.access.actions import do_create_token

from ..factories import UserFactory


@pytest.fixture
def alice(db):
    user = UserFactory(username="alice")
    _, raw = do_create_token(user)
    user.raw_token = raw
    return user


def multipart(content: bytes, filename: str = "submission.py") -> tuple[bytes, str]:
    """Exactly reqwest's Form::new().part("file", Part::bytes(..).file_name(..)): no part content type."""
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n\r\n"
            ).encode() + content + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


class Popcorn:
    """Sends popcorn-cli's requests through Django's test client and parses answers as the client does."""

    def __init__(self, client, cli_id: str | None):
        self.client, self.cli_id = client, cli_id

    def headers(self) -> dict[str, str]:
        return {"X-Popcorn-Cli-Id": self.cli_id} if self.cli_id else {}

    def get(self, path: str, **kw):
        return self.client.get(f"/popcorn/{path}", headers={**self.headers(), **kw.pop("headers", {})}, **kw)

    def delete(self, path: str, **kw):
        return self.client.delete(f"/popcorn/{path}", headers={**self.headers(), **kw.pop("headers", {})}, **kw)

    def submit(self, leaderboard: str, gpu: str, mode: str, content: bytes, filename: str = "submission.py",
               stream: bool = False):
        body, content_type = multipart(content, filename)
        prefix = "" if stream else "submission/"
        return self.client.generic("POST", f"/popcorn/{prefix}{leaderboard.lower()}/{gpu}/{mode.lower()}", body,
                                   content_type=content_type, headers=self.headers())


def error_text(response) -> str:
    """popcorn prints `detail` when it is a string, else the raw body: ours must always be a string."""
    body = json.loads(response.content)
    assert set(body) == {"detail"} and isinstance(body["detail"], str), body
    return body["detail"]


@pytest.fixture
def popcorn(client, alice):
    return Popcorn(client, alice.raw_token)
