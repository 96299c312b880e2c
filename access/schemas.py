from __future__ import annotations

from datetime import datetime

from ninja import Schema


class MeOut(Schema):
    id: int
    username: str
    display_name: str
    is_staff: bool


class TokenOut(Schema):
    id: int
    name: str
    hint: str
    created: datetime
    expires: datetime | None
    last_used: datetime | None


class TokenIn(Schema):
    name: str = "cli"
    expires_days: int | None = None


class TokenCreatedOut(TokenOut):
    token: str


class PasswordLoginIn(Schema):
    username: str
    password: str
    name: str = "kernelbot-cli"
    expires_days: int | None = None


class CliLoginOut(Schema):
    cli_id: str
    link_url: str


class JoinIn(Schema):
    code: str


class JoinedOut(Schema):
    leaderboard: str
