from __future__ import annotations

from datetime import datetime

from ninja import Field, Schema

from kernelbot.inputs import Int, Text

MAX_DAYS = 3650


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
    name: str = Field("cli", max_length=80)
    expires_days: Int | None = Field(None, ge=1, le=MAX_DAYS)


class TokenCreatedOut(TokenOut):
    token: str


class PasswordLoginIn(Schema):
    username: Text
    password: str
    name: str = Field("kernelbot-cli", max_length=80)
    expires_days: Int | None = Field(None, ge=1, le=MAX_DAYS)


class CliLoginOut(Schema):
    cli_id: str
    link_url: str


class JoinIn(Schema):
    code: Text


class JoinedOut(Schema):
    leaderboard: str
