"""Users' SSH public keys: added by hand or imported from GitHub (`<GITHUB_WEB_URL>/<login>.keys`), placed on the
nodes of their reservations while they last (`access.SlurmAccess`). Every key is checked at the door by `parse_key`
and stored as its bare `type base64` pair, so what reaches an authorized_keys file is one line of a known type and
base64 digits, never options, a comment or a second line of the user's."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from dataclasses import dataclass

import httpx
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from kernelbot.errors import Refused
from runners import wakeups

from . import allocator
from .models import DeviceHold, HoldKind, ReservationStatus, SshKey, SshKeySource

MAX_KEYS = 20  # per user, imported ones included
MAX_LINE = 16 * 1024  # an 16384-bit RSA key is ~2.8 kB of base64
MIN_RSA_BITS = 2048
KEY_TYPES = frozenset({"ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
                       "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com"})
BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")
# GitHub's rule: 1-39 letters, digits and single inner hyphens
GITHUB_LOGIN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9]|-(?=[A-Za-z0-9])){0,38}")
TITLE_CHARS = re.compile(r"[^\x00-\x1f\x7f]*")


@dataclass(frozen=True)
class ParsedKey:
    key: str  # "type base64"
    fingerprint: str
    comment: str


def parse_key(text: str) -> ParsedKey:
    """One OpenSSH public key line (`type base64 [comment]`), or a 400 saying what is wrong with it."""
    text = (text or "").strip()
    if not text:
        raise Refused("Paste an SSH public key (the one line of a .pub file).", 400)
    if len(text) > MAX_LINE:
        raise Refused(f"An SSH public key line is at most {MAX_LINE} characters.", 400)
    if len(text.splitlines()) > 1 or "\x00" in text:  # \n, \r and every other line boundary Python knows
        raise Refused("One SSH public key per line: the text holds a line break or a NUL byte.", 400)
    parts = text.split(maxsplit=2)
    kind = parts[0]
    if kind not in KEY_TYPES:
        if any(p in KEY_TYPES for p in text.split()[1:]) or "=" in kind or "," in kind:
            raise Refused("Options before the key (command=, from=, …) are not accepted: give the key alone.", 400)
        raise Refused(f"'{kind[:40]}' is not an SSH public key type this site accepts "
                      f"({', '.join(sorted(KEY_TYPES))}).", 400)
    if len(parts) < 2 or not BASE64.fullmatch(parts[1]):
        raise Refused(f"The {kind} key's data is missing or is not base64.", 400)
    try:
        blob = base64.b64decode(parts[1], validate=True)
        (length,) = struct.unpack(">I", blob[:4])
        named = blob[4:4 + length].decode("ascii")
    except (binascii.Error, struct.error, UnicodeDecodeError):
        raise Refused(f"The {kind} key's data is not a valid key.", 400) from None
    if named != kind:
        raise Refused(f"The key says it is {kind} but its data is a {named[:40] or 'different'} key.", 400)
    try:
        public = serialization.load_ssh_public_key(f"{kind} {parts[1]}".encode())
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise Refused(f"The {kind} key's data is not a valid key: {exc}.", 400) from None
    if isinstance(public, rsa.RSAPublicKey) and public.key_size < MIN_RSA_BITS:
        raise Refused(f"RSA keys need at least {MIN_RSA_BITS} bits; this one has {public.key_size}.", 400)
    fingerprint = "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    comment = parts[2].strip() if len(parts) > 2 else ""
    return ParsedKey(key=f"{kind} {base64.b64encode(blob).decode()}", fingerprint=fingerprint,
                     comment=comment if TITLE_CHARS.fullmatch(comment) else "")


def check_title(title: str) -> str:
    title = (title or "").strip()
    if len(title) > 100 or not TITLE_CHARS.fullmatch(title):
        raise Refused("A key's title is at most 100 characters, with no control characters.", 400)
    return title


def keys_of(user) -> QuerySet[SshKey]:
    return SshKey.objects.filter(user=user)


def lock_user(user) -> None:
    """The user's row lock: adds and imports count and insert under it, so two at once cannot pass the cap."""
    get_user_model().objects.select_for_update().filter(pk=user.pk).first()


def check_room(user, adding: int) -> None:
    held = keys_of(user).count()
    if held + adding > MAX_KEYS:
        raise Refused(f"At most {MAX_KEYS} SSH keys per user; you have {held}. Remove one first.", 409)


def check_add_key(user, text: str, title: str = "") -> tuple[ParsedKey, str]:
    parsed, title = parse_key(text), check_title(title)
    if same := keys_of(user).filter(fingerprint=parsed.fingerprint).first():
        raise Refused(f"This key ({parsed.fingerprint}) is already on your profile as #{same.pk}.", 409)
    check_room(user, 1)
    return parsed, title or parsed.comment[:100]


def do_add_key(user, text: str, title: str = "") -> SshKey:
    try:
        with transaction.atomic():
            lock_user(user)
            parsed, title = check_add_key(user, text, title)
            key = SshKey.objects.create(user=user, key=parsed.key, fingerprint=parsed.fingerprint, title=title)
            keys_changed(user)
            return key
    except IntegrityError:  # the same key added twice at once
        raise Refused("This key is already on your profile.", 409) from None


def do_remove_key(user, key_id: int) -> None:
    if not keys_of(user).filter(pk=key_id).delete()[0]:
        raise Refused(f"You have no SSH key #{key_id}.", 404)
    keys_changed(user)


def keys_changed(user) -> None:
    """The agents of the nodes where the user's reservations are active place their keys anew (on commit)."""
    for node_id in set(DeviceHold.objects.held().filter(kind=HoldKind.RESERVATION, reservation__user=user)
                       .values_list("node_id", flat=True)):
        wakeups.node_changed(node_id)


def check_github_login(login: str) -> str:
    login = (login or "").strip().removeprefix("@")
    if not GITHUB_LOGIN.fullmatch(login):
        raise Refused(f"'{login[:60]}' is not a GitHub login (letters, digits and single inner hyphens, at most 39).",
                      400)
    return login


def fetch_github_keys(login: str) -> list[str]:
    """The public key lines GitHub lists for a (checked) login."""
    url = f"{settings.GITHUB_WEB_URL}/{login}.keys"
    try:
        answer = httpx.get(url, timeout=settings.GITHUB_KEYS_TIMEOUT, follow_redirects=False)
    except httpx.HTTPError as exc:
        raise Refused(f"Could not reach GitHub for {login}'s keys ({type(exc).__name__}); try again later.",
                      502) from None
    if answer.status_code == 404:
        raise Refused(f"GitHub has no user '{login}'.", 404)
    if answer.status_code != 200:
        raise Refused(f"GitHub answered {answer.status_code} for {login}'s keys; try again later.", 502)
    return [line for line in answer.text[:MAX_KEYS * MAX_LINE].splitlines() if line.strip()]


def do_import_github(user, login: str) -> tuple[list[SshKey], list[str]]:
    """Replace the user's keys imported from this login by the ones GitHub lists now: (keys, skipped with why).
    A key already on the profile otherwise is skipped; keys this site does not accept (DSA, short RSA) too."""
    login = check_github_login(login)
    found, skipped = {}, []
    for line in fetch_github_keys(login):
        try:
            parsed = parse_key(line)
        except Refused as exc:
            skipped.append(f"{line.split()[0][:40]}: {exc.message}")
            continue
        found.setdefault(parsed.fingerprint, parsed)
    if not found:
        raise Refused(f"GitHub lists no SSH key this site accepts for '{login}'"
                      + (f" ({'; '.join(skipped)})." if skipped else "."), 404)
    with transaction.atomic():
        lock_user(user)
        keys_of(user).filter(source=SshKeySource.GITHUB, github_login__iexact=login).delete()
        others = set(keys_of(user).filter(fingerprint__in=found).values_list("fingerprint", flat=True))
        skipped += [f"{found[f].key.split()[0]} {f}: already on your profile" for f in sorted(others)]
        new = [p for f, p in found.items() if f not in others]
        check_room(user, len(new))
        keys = SshKey.objects.bulk_create(
            SshKey(user=user, key=p.key, fingerprint=p.fingerprint, title=f"{login}@github", github_login=login,
                   source=SshKeySource.GITHUB) for p in new)
        keys_changed(user)
    return keys, skipped


def snapshot(user) -> list[str]:
    """The `type base64` lines to place for a reservation of this user's, as they are when it starts (checked
    again: only a row `parse_key` wrote can have this shape, whatever wrote it)."""
    return [k for k in keys_of(user).values_list("key", flat=True)
            if (kind := k.split(" ", 1)[0]) in KEY_TYPES and BASE64.fullmatch(k[len(kind) + 1:])]


def placed_on(node_id: int) -> list[dict]:
    """The reservations active on a node now whose holders have keys, with the node's devices each holds: what a
    local pool's node agent keeps in its authorized_keys (`runners.harness.node`). The holders' keys as they are now."""
    held: dict[int, dict] = {}
    for rid, user_id, index in allocator.current_holds(node_id, timezone.now()).filter(
            reservation__status=ReservationStatus.ACTIVE).values_list("reservation_id", "reservation__user_id",
                                                                      "gpu__index"):
        held.setdefault(rid, {"reservation": rid, "user": user_id, "gpus": []})["gpus"].append(index)
    lines: dict[int, list[str]] = {}
    for user_id, key in SshKey.objects.filter(user_id__in={h["user"] for h in held.values()}).values_list(
            "user_id", "key"):
        lines.setdefault(user_id, []).append(key)
    return [{"reservation": h["reservation"], "gpus": sorted(h["gpus"]), "keys": lines[h["user"]]}
            for h in sorted(held.values(), key=lambda h: h["reservation"]) if h["user"] in lines]
