"""Refusals every app raises and every front-end renders: the one shared vocabulary, so the apps below the
competition (runners, reservations) need not import it."""

from ninja import Schema


class Refused(Exception):
    """A request the service layer refuses; `status` is the HTTP status every front-end answers with (the API
    and popcorn as {"detail": message}, the site as its error page or form error, websockets as a close code)."""

    def __init__(self, message: str, status: int = 400, retry_after: int | None = None):
        super().__init__(message)
        self.message, self.status, self.retry_after = message, status, retry_after


class AccessDenied(Refused):
    """Not visible to this user (404), not theirs to change or read (403), or a refused access step."""


class ErrorOut(Schema):
    detail: str
