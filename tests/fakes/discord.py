"""A loopback fake of Discord's gateway and REST API, enough for an unmodified discord.py application-command bot:
one guild with channels and roles, slash-command, autocomplete and button interactions pushed over the gateway,
interaction callbacks, webhook (interaction token) and channel messages, DMs and attachment downloads. It keeps every
message and its edit history, applies a per-message edit rate limit like Discord's (429 with retry_after, and the
X-RateLimit headers on every message call) and can drop the gateway connection to make the client RESUME.

Faults as real Discord has them: 500 on every REST call for a while (`fail_for`), message content over 2,000
characters (50035), uploads over the size limit (413, 40005), interaction tokens that expire (401, 50027), an
interaction answered twice (400, 40060) and members whose DMs are closed (403, 50007)."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import WSMsgType, web

APP_ID = 900_000_000_000_000_001
GUILD_ID = 900_000_000_000_000_002
CHANNEL_ID = 900_000_000_000_000_003
ORGANISER_ROLE_ID = 900_000_000_000_000_004
OPTION_TYPES = {str: 3, int: 4, bool: 5}
EDITS_PER_WINDOW, EDIT_WINDOW = 5, 5.0  # Discord: about 5 edits per 5 s per message
MAX_CONTENT = 2000  # characters of a message's content
UPLOAD_LIMIT = 10 * 1024 * 1024  # bytes of a message's files together (a server without boosts)


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


@dataclass
class Attachment:
    filename: str
    data: bytes
    id: int = 0


@dataclass
class Message:
    id: int
    channel_id: int
    content: str
    flags: int = 0
    components: list = field(default_factory=list)
    files: list[tuple[str, bytes]] = field(default_factory=list)
    history: list[str] = field(default_factory=list)  # every content it had, oldest first
    edit_times: list[float] = field(default_factory=list)  # recent edits, for the rate limit
    changed_at: list[float] = field(default_factory=list)  # when each `history` entry was set
    interaction_id: int | None = None
    via: str = ""  # callback, webhook, channel
    allowed_mentions: dict | None = None  # as sent: who the message may ping

    @property
    def ephemeral(self) -> bool:
        return bool(self.flags & 64)


# Snowflakes are unique across the test process, as Discord's are for ever: discord.py keeps one webhook adapter per
# process whose rate-limit locks are keyed by interaction token, so a token seen again by a later test's bot (on its
# own event loop) would meet a lock still held on an earlier, stopped loop.
SNOWFLAKES = itertools.count(1_000_000_000_000_000_000)


class FakeDiscord:
    def __init__(self):
        self.ids = SNOWFLAKES
        self.messages: dict[int, Message] = {}
        self.deleted: list[Message] = []
        self.refuse_posts = 0  # the next N channel messages get 403 Missing Access, as from a misconfigured channel
        self.tokens: dict[str, dict[str, Any]] = {}  # interaction token → {"original": message id, ...}
        self.attachments: dict[int, Attachment] = {}
        self.users: dict[int, dict] = {}
        self.dm_channels: dict[int, int] = {}  # channel id → user id
        self.requests: list[tuple[str, str]] = []
        self.rate_limited = 0
        self.commands: list[dict] = []
        self.identifies = self.resumes = 0
        self.callback_bodies: dict[int, dict] = {}
        self.answered: dict[int, float] = {}  # interaction id → seconds from push to its callback
        self.pushed_at: dict[int, float] = {}
        self.changed = threading.Condition()
        self.ws: web.WebSocketResponse | None = None
        self.seq = 0
        self.session = "fake-session"
        self.sent: list[dict] = []  # dispatched events, for replay on RESUME
        self.delivered = 0  # how many of `sent` the current connection has seen
        self.ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.port = 0
        self.bot_user = self.user(APP_ID, "kernelbot", bot=True)
        self.channels = {CHANNEL_ID: "submissions"}
        self.roles = {GUILD_ID: "@everyone", ORGANISER_ROLE_ID: "organisers"}
        # faults
        self.failing_until = 0.0  # monotonic time: every REST call answers 500 before it
        self.failed = 0  # calls answered 500
        self.refused: list[tuple[int, str]] = []  # (code, path) of every 4xx fault answered
        self.dm_closed: set[int] = set()  # users who accept no DMs
        self.expired_tokens: set[str] = set()  # interaction tokens Discord no longer accepts
        self.acknowledged_elsewhere: set[int] = set()  # interactions whose first callback gets 40060
        self.upload_limit = UPLOAD_LIMIT
        self.bucket_remaining, self.bucket_reset_after = 4, 1.0  # the X-RateLimit headers of message calls

    # --- running ------------------------------------------------------------------------------------------------
    def start(self) -> None:
        started = threading.Event()

        def serve():
            self.loop = asyncio.new_event_loop()
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("GET", "/gateway", self.gateway)
            app.router.add_route("GET", "/attachments/{id}/{name}", self.attachment)
            app.router.add_route("*", "/api/v10/{path:.*}", self.rest)
            self.runner = web.AppRunner(app)
            self.loop.run_until_complete(self.runner.setup())
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            self.loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=serve, daemon=True, name="fake-discord")
        self.thread.start()
        started.wait(10)

    def stop(self) -> None:
        if self.loop is not None:
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def _notify(self) -> None:
        with self.changed:
            self.changed.notify_all()

    def wait_for(self, predicate, timeout: float = 30, what: str = "") -> Any:
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                found = predicate()
                if found:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out waiting for {what or predicate}")
                self.changed.wait(min(left, 0.2))

    # --- objects ------------------------------------------------------------------------------------------------
    def user(self, user_id: int, name: str, bot: bool = False) -> dict:
        self.users[user_id] = {"id": str(user_id), "username": name, "discriminator": "0", "global_name": name,
                               "avatar": None, "bot": bot, "public_flags": 0}
        return self.users[user_id]

    def member(self, user_id: int, roles: list[int]) -> dict:
        return {"user": self.users[user_id], "roles": [str(r) for r in roles], "joined_at": now_iso(), "deaf": False,
                "mute": False, "flags": 0, "nick": None, "avatar": None, "permissions": "2147483647"}

    def message_json(self, m: Message) -> dict:
        return {"id": str(m.id), "channel_id": str(m.channel_id), "type": 0, "content": m.content,
                "author": self.bot_user, "timestamp": now_iso(), "edited_timestamp": None, "tts": False,
                "mention_everyone": False, "mentions": [], "mention_roles": [], "embeds": [], "pinned": False,
                "flags": m.flags, "components": m.components, "application_id": str(APP_ID),
                "attachments": [{"id": str(next(self.ids)), "filename": n, "size": len(d), "url": "", "proxy_url": ""}
                                for n, d in m.files]}

    def guild_json(self) -> dict:
        roles = [{"id": str(r), "name": n, "permissions": "0", "position": i, "color": 0, "hoist": False,
                  "managed": False, "mentionable": False, "flags": 0} for i, (r, n) in enumerate(self.roles.items())]
        channels = [{"id": str(c), "type": 0, "name": n, "position": i, "guild_id": str(GUILD_ID),
                     "permission_overwrites": []} for i, (c, n) in enumerate(self.channels.items())]
        return {"id": str(GUILD_ID), "name": "Kernel Club", "owner_id": "1", "roles": roles, "channels": channels,
                "members": [], "member_count": 1, "emojis": [], "stickers": [], "features": [], "threads": [],
                "unavailable": False, "large": False, "joined_at": now_iso(), "voice_states": [], "presences": [],
                "stage_instances": [], "guild_scheduled_events": [], "soundboard_sounds": [],
                "premium_tier": 0, "verification_level": 0, "default_message_notifications": 0,
                "explicit_content_filter": 0, "mfa_level": 0, "nsfw_level": 0, "preferred_locale": "en-US",
                "afk_timeout": 300, "system_channel_flags": 0, "icon": None, "splash": None, "banner": None,
                "description": None, "vanity_url_code": None, "premium_subscription_count": 0}

    def fail_for(self, seconds: float) -> None:
        """Every REST call answers 500 for `seconds` from now, as during a Discord outage."""
        self.failing_until = time.monotonic() + seconds

    def in_channel(self, channel_id: int) -> list[Message]:
        return [m for m in self.messages.values() if m.channel_id == channel_id and m.via == "channel"]

    # --- gateway ------------------------------------------------------------------------------------------------
    async def gateway(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_json({"op": 10, "d": {"heartbeat_interval": 40000}})
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            data = json.loads(msg.data)
            op = data.get("op")
            if op == 1:
                await ws.send_json({"op": 11})
            elif op == 2:
                self.identifies += 1
                self.ws, self.sent, self.delivered, self.seq = ws, [], 0, 0
                await self._dispatch("READY", {
                    "v": 10, "user": self.bot_user, "guilds": [{"id": str(GUILD_ID), "unavailable": True}],
                    "session_id": self.session, "resume_gateway_url": f"ws://127.0.0.1:{self.port}/gateway",
                    "application": {"id": str(APP_ID), "flags": 0}, "private_channels": [], "relationships": []})
                await self._dispatch("GUILD_CREATE", self.guild_json())
                self.ready.set()
            elif op == 6:
                self.resumes += 1
                self.ws = ws
                missed = [e for e in self.sent if e["s"] > data["d"]["seq"]]
                for event in missed:
                    await ws.send_json(event)
                self.delivered = len(self.sent)
                await self._dispatch("RESUMED", {})
                self.ready.set()
        if self.ws is ws:
            self.ws = None
        return ws

    async def _dispatch(self, name: str, data: dict) -> None:
        self.seq += 1
        event = {"op": 0, "t": name, "s": self.seq, "d": data}
        self.sent.append(event)
        if self.ws is not None and not self.ws.closed:
            await self.ws.send_json(event)
            self.delivered = len(self.sent)

    def drop_connection(self) -> None:
        """Close the gateway socket as Discord does on a reconnect request; the client resumes."""
        self.ready.clear()

        async def close():
            ws, self.ws = self.ws, None
            if ws is not None:
                await ws.close(code=4000)
        self.call(close())

    # --- interactions -------------------------------------------------------------------------------------------
    def _options(self, values: dict[str, Any], resolved: dict) -> list[dict]:
        options = []
        for name, value in values.items():
            if value is None:
                continue
            if isinstance(value, Attachment):
                value.id = value.id or next(self.ids)
                self.attachments[value.id] = value
                url = f"{self.url}/attachments/{value.id}/{value.filename}"
                resolved.setdefault("attachments", {})[str(value.id)] = {
                    "id": str(value.id), "filename": value.filename, "size": len(value.data), "url": url,
                    "proxy_url": url, "content_type": "text/plain"}
                options.append({"name": name, "type": 11, "value": str(value.id)})
            elif isinstance(value, tuple) and value[0] == "focused":
                options.append({"name": name, "type": 3, "value": value[1], "focused": True})
            else:
                options.append({"name": name, "type": OPTION_TYPES[type(value)], "value": value})
        return options

    def _interaction(self, kind: int, data: dict, user_id: int, roles: list[int], channel_id: int,
                     message: dict | None = None) -> dict:
        interaction_id = next(self.ids)
        token = f"token-{interaction_id}"
        self.tokens[token] = {"original": None, "id": interaction_id}
        payload = {"id": str(interaction_id), "application_id": str(APP_ID), "type": kind, "token": token,
                   "version": 1, "guild_id": str(GUILD_ID), "channel_id": str(channel_id),
                   "channel": {"id": str(channel_id), "type": 0, "guild_id": str(GUILD_ID), "name": "x", "position": 0,
                               "permission_overwrites": [], "nsfw": False, "parent_id": None},
                   "member": self.member(user_id, roles), "data": data, "locale": "en-US", "guild_locale": "en-US",
                   "app_permissions": "2147483647", "entitlements": [], "authorizing_integration_owners": {},
                   "context": 0, "attachment_size_limit": self.upload_limit}
        if message is not None:
            payload["message"] = message
        return payload

    def command(self, path: str, member_id: int, /, *, roles: list[int] | None = None, channel_id: int = CHANNEL_ID,
                autocomplete: bool = False, acknowledged: bool = False, **values: Any) -> int:
        """Push `/a b c opt:value…` from user `member_id`; returns the interaction id. `acknowledged`: Discord
        answers the bot's first callback with 40060, as when another process answered the interaction."""
        if member_id not in self.users:
            self.user(member_id, f"member{member_id % 10000}")
        names = path.split()
        resolved: dict = {}
        options = self._options(values, resolved)
        for depth, name in reversed(list(enumerate(names[1:], start=1))):
            options = [{"name": name, "type": 1 if depth == len(names) - 1 else 2, "options": options}]
        data = {"id": str(next(self.ids)), "name": names[0], "type": 1, "options": options,
                "guild_id": str(GUILD_ID)}
        if resolved:
            data["resolved"] = resolved
        payload = self._interaction(4 if autocomplete else 2, data, member_id, roles or [], channel_id)
        if acknowledged:
            self.acknowledged_elsewhere.add(int(payload["id"]))
        return self._push(payload)

    def press(self, message: Message, custom_id: str, user_id: int, roles: list[int] | None = None) -> int:
        if user_id not in self.users:
            self.user(user_id, f"member{user_id % 10000}")
        payload = self._interaction(3, {"custom_id": custom_id, "component_type": 2}, user_id, roles or [],
                                    message.channel_id, self.message_json(message))
        self.tokens[payload["token"]]["message"] = message.id
        return self._push(payload)

    def choose(self, message: Message, custom_id: str, user_id: int, values: list[str]) -> int:
        """Pick `values` in a select menu of `message`."""
        payload = self._interaction(3, {"custom_id": custom_id, "component_type": 3, "values": values}, user_id, [],
                                    message.channel_id, self.message_json(message))
        self.tokens[payload["token"]]["message"] = message.id
        return self._push(payload)

    def _push(self, payload: dict) -> int:
        interaction_id = int(payload["id"])
        self.pushed_at[interaction_id] = time.monotonic()
        self.call(self._dispatch("INTERACTION_CREATE", payload))
        return interaction_id

    def answer(self, interaction_id: int, timeout: float = 30) -> dict:
        """The interaction's callback body (waits for it)."""
        return self.wait_for(lambda: self.callback_bodies.get(interaction_id), timeout,
                             f"the answer to interaction {interaction_id}")

    def original(self, interaction_id: int) -> Message | None:
        message_id = self.tokens[f"token-{interaction_id}"]["original"]
        return self.messages.get(message_id) if message_id else None

    def followups(self, interaction_id: int) -> list[Message]:
        token = f"token-{interaction_id}"
        return [m for m in self.messages.values() if m.via == f"webhook:{token}"]

    # --- REST ---------------------------------------------------------------------------------------------------
    async def attachment(self, request: web.Request) -> web.Response:
        found = self.attachments.get(int(request.match_info["id"]))
        if found is None:
            return web.Response(status=404)
        return web.Response(body=found.data, content_type="application/octet-stream")

    async def _body(self, request: web.Request) -> tuple[dict, list[tuple[str, bytes]]]:
        if request.content_type.startswith("multipart/"):
            payload, files = {}, []
            reader = await request.multipart()
            async for part in reader:
                if part.name == "payload_json":
                    payload = json.loads(await part.text())
                else:
                    files.append((part.filename, await part.read()))
            return payload, files
        text = await request.text()
        return (json.loads(text) if text else {}), []

    @staticmethod
    def json(data: Any, status: int = 200) -> web.Response:
        # discord.py compares the content type exactly: no charset
        return web.Response(body=json.dumps(data).encode(), status=status, headers={"Content-Type": "application/json"})

    def _new_message(self, channel_id: int, body: dict, files, via: str, interaction_id: int | None = None) -> Message:
        m = Message(next(self.ids), channel_id, body.get("content") or "", int(body.get("flags") or 0),
                    body.get("components") or [], files, [body.get("content") or ""], [time.monotonic()],
                    [time.monotonic()], interaction_id, via, body.get("allowed_mentions"))
        self.messages[m.id] = m
        return m

    def _edit(self, m: Message, body: dict, files) -> web.Response | None:
        now = time.monotonic()
        recent = [t for t in m.edit_times if now - t < EDIT_WINDOW]
        if len(recent) >= EDITS_PER_WINDOW:
            self.rate_limited += 1
            retry = EDIT_WINDOW - (now - recent[0])
            limited = self.json({"message": "You are being rate limited.", "retry_after": retry, "global": False}, 429)
            limited.headers["Via"] = "1.1 google"  # as Discord sends it; discord.py treats a 429 without it as a ban
            return limited
        m.edit_times = recent + [now]
        if "content" in body:
            m.content = body["content"] or ""
            m.history.append(m.content)
            m.changed_at.append(now)
        if "components" in body:
            m.components = body["components"] or []
        m.files += files
        return None

    def error(self, status: int, code: int, message: str, path: str, **extra: Any) -> web.Response:
        self.refused.append((code, path))
        return self.json({"message": message, "code": code, **extra}, status)

    def _too_big(self, body: dict, files, path: str) -> web.Response | None:
        if len(body.get("content") or "") > MAX_CONTENT:
            return self.error(400, 50035, "Invalid Form Body", path, errors={"content": {"_errors": [
                {"code": "BASE_TYPE_MAX_LENGTH", "message": f"Must be {MAX_CONTENT} or fewer in length."}]}})
        if sum(len(data) for _, data in files) > self.upload_limit:
            return self.error(413, 40005, "Request entity too large", path)
        return None

    async def rest(self, request: web.Request) -> web.Response:
        path, method = request.match_info["path"], request.method
        self.requests.append((method, path))
        try:
            if time.monotonic() < self.failing_until:
                self.failed += 1
                return web.Response(status=500, text="500: Internal Server Error")
            response = await self._rest(request, method, path.split("/"))
            if "messages" in path or path.startswith("webhooks"):
                # the headers discord.py reads to pace itself (one bucket per route, never exhausted here)
                response.headers.update({"X-RateLimit-Limit": "5",
                                         "X-RateLimit-Remaining": str(self.bucket_remaining),
                                         "X-RateLimit-Reset": f"{time.time() + self.bucket_reset_after:.3f}",
                                         "X-RateLimit-Reset-After": f"{self.bucket_reset_after:.3f}",
                                         "X-RateLimit-Bucket": "fake-bucket"})
            return response
        finally:
            self._notify()

    async def _rest(self, request: web.Request, method: str, parts: list[str]) -> web.Response:
        if parts == ["users", "@me"]:
            return self.json(self.bot_user)
        if parts[:2] == ["oauth2", "applications"]:
            return self.json({"id": str(APP_ID), "name": "kernelbot", "description": "", "icon": None,
                              "bot_public": True, "bot_require_code_grant": False, "verify_key": "0" * 64,
                              "owner": self.users[APP_ID], "flags": 0, "team": None})
        if parts[0] == "applications" and parts[-1] == "commands":
            body, _ = await self._body(request)
            self.commands = [{**c, "id": str(next(self.ids)), "application_id": str(APP_ID), "version": "1",
                              "default_member_permissions": None, "type": c.get("type", 1),
                              "guild_id": str(GUILD_ID)} for c in body]
            return self.json(self.commands)
        if parts[0] == "interactions" and parts[-1] == "callback":
            interaction_id, token = int(parts[1]), parts[2]
            body, files = await self._body(request)
            if interaction_id in self.acknowledged_elsewhere or interaction_id in self.callback_bodies:
                self.acknowledged_elsewhere.discard(interaction_id)
                self.callback_bodies.setdefault(interaction_id, {"type": 5, "data": {}})
                if self.tokens[token]["original"] is None:  # what the other answer made
                    self.tokens[token]["original"] = self._new_message(CHANNEL_ID, {}, [], "callback",
                                                                       interaction_id).id
                return self.error(400, 40060, "Interaction has already been acknowledged.", "/".join(parts))
            if refused := self._too_big(body.get("data") or {}, files, "/".join(parts)):
                return refused
            self.callback_bodies[interaction_id] = body
            self.answered[interaction_id] = time.monotonic() - self.pushed_at.get(interaction_id, time.monotonic())
            kind, data = body.get("type"), body.get("data") or {}
            resource: dict = {"type": kind}
            about = {"id": str(interaction_id), "type": 2}
            if kind in (4, 5):
                m = self._new_message(CHANNEL_ID, data, files, "callback", interaction_id)
                self.tokens[token]["original"] = m.id
                resource["message"] = self.message_json(m)
                about |= {"response_message_id": str(m.id), "response_message_loading": kind == 5,
                          "response_message_ephemeral": m.ephemeral}
            elif kind == 7:
                message_id = self.tokens[token].get("message")
                if message_id in self.messages:
                    self._edit(self.messages[message_id], data, files)
            return self.json({"interaction": about, "resource": resource})
        if parts[0] == "webhooks":
            token = parts[2]
            if token not in self.tokens:
                return self.json({"message": "Unknown Webhook", "code": 10015}, 404)
            if token in self.expired_tokens:
                return self.error(401, 50027, "Invalid Webhook Token", "/".join(parts))
            body, files = await self._body(request)
            if refused := self._too_big(body, files, "/".join(parts)):
                return refused
            if method == "POST":
                m = self._new_message(CHANNEL_ID, body, files, f"webhook:{token}")
                return self.json(self.message_json(m))
            target = self.tokens[token]["original"] if parts[-1] == "@original" else int(parts[-1])
            m = self.messages.get(target)
            if m is None:
                return self.json({"message": "Unknown Message", "code": 10008}, 404)
            if method == "PATCH":
                return self._edit(m, body, files) or self.json(self.message_json(m))
            if method == "DELETE":
                self.deleted.append(self.messages.pop(m.id))
                return web.Response(status=204)
        if parts[:2] == ["users", "@me"] and parts[2:] == ["channels"]:
            body, _ = await self._body(request)
            user_id = int(body["recipient_id"])
            channel_id = next((c for c, u in self.dm_channels.items() if u == user_id), None) or next(self.ids)
            self.dm_channels[channel_id] = user_id
            return self.json({"id": str(channel_id), "type": 1, "recipients": [self.users[user_id]],
                              "last_message_id": None})
        if parts[0] == "users" and len(parts) == 2:
            found = self.users.get(int(parts[1]))
            return self.json(found) if found else self.json({"message": "Unknown User", "code": 10013}, 404)
        if parts[0] == "channels" and parts[2:3] == ["messages"]:
            channel_id = int(parts[1])
            body, files = await self._body(request)
            if refused := self._too_big(body, files, "/".join(parts)):
                return refused
            if self.dm_channels.get(channel_id) in self.dm_closed:
                return self.error(403, 50007, "Cannot send messages to this user", "/".join(parts))
            if method == "POST":
                if self.refuse_posts > 0:
                    self.refuse_posts -= 1
                    return self.json({"message": "Missing Access", "code": 50001}, 403)
                return self.json(self.message_json(self._new_message(channel_id, body, files, "channel")))
            m = self.messages.get(int(parts[3]))
            if m is None:
                return self.json({"message": "Unknown Message", "code": 10008}, 404)
            return self._edit(m, body, files) or self.json(self.message_json(m))
        return self.json({"message": f"the fake does not know {method} /{'/'.join(parts)}", "code": 0}, 404)

