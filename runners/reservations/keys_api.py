"""/api/v1/gpus/keys…: the caller's SSH public keys (list, add, delete, import from GitHub). Thin over `keys`."""

from __future__ import annotations

from datetime import datetime

from ninja import Router, Schema
from pydantic import Field

from kernelbot.errors import ErrorOut

from . import keys
from .models import SshKey

router = Router(tags=["gpus"])  # mounted with the API token auth by kernelbot.api
ERRORS = {400: ErrorOut, 401: ErrorOut, 404: ErrorOut, 409: ErrorOut, 502: ErrorOut}


class KeyIn(Schema):
    key: str = Field(max_length=keys.MAX_LINE, description="One OpenSSH public key line, as in a .pub file")
    title: str = Field("", max_length=100, description="Default: the key's comment")


class GithubIn(Schema):
    login: str = Field(max_length=60)


class KeyOut(Schema):
    id: int
    key: str
    title: str
    fingerprint: str
    source: str
    github_login: str
    created: datetime


class ImportOut(Schema):
    keys: list[KeyOut]
    skipped: list[str] = Field(description="Keys GitHub lists that were not imported, with why")


def key_out(k: SshKey) -> dict:
    return {"id": k.pk, "key": k.key, "title": k.title, "fingerprint": k.fingerprint, "source": k.source,
            "github_login": k.github_login, "created": k.created}


@router.get("/gpus/keys", response={200: list[KeyOut], 401: ErrorOut})
def list_keys(request):
    """Your SSH public keys, placed on the nodes of your reservations while they last."""
    return [key_out(k) for k in keys.keys_of(request.auth)]


@router.post("/gpus/keys", response={201: KeyOut, **ERRORS})
def add_key(request, body: KeyIn):
    return 201, key_out(keys.do_add_key(request.auth, body.key, body.title))


@router.post("/gpus/keys/github", response={201: ImportOut, **ERRORS})
def import_github(request, body: GithubIn):
    """Import the keys GitHub lists for a login (https://github.com/<login>.keys), replacing the ones imported from
    it before."""
    imported, skipped = keys.do_import_github(request.auth, body.login)
    return 201, {"keys": [key_out(k) for k in imported], "skipped": skipped}


# after /gpus/keys/github, whose path it would match; a key_id that is not a number is a 422 like every path parameter
@router.delete("/gpus/keys/{key_id}", response={204: None, **ERRORS})
def delete_key(request, key_id: int):
    keys.do_remove_key(request.auth, key_id)
    return 204, None
