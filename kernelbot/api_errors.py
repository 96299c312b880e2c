"""Every API error is {"detail": "<message>"}: the one mapping from what the service layer refuses to an HTTP
answer, shared by /api/v1 and popcorn's polled routes (both NinjaAPIs) and popcorn's streamed route (a plain
view). Refusals keep their status (and a quota's Retry-After)."""

from __future__ import annotations

import logging

from django.db import DataError
from django.http import Http404, JsonResponse
from ninja import NinjaAPI
from ninja.errors import HttpError, ValidationError

from leaderboards.errors import Refused

log = logging.getLogger(__name__)
NUL_BYTES = "The request holds characters that cannot be stored or looked up (such as NUL bytes)."


def refusal(exc: Exception) -> tuple[str, int, dict[str, str]] | None:
    """(message, status, headers) for an exception that is an answer to the client; None for a server error."""
    if isinstance(exc, Refused):
        return exc.message, exc.status, {"Retry-After": str(exc.retry_after)} if exc.retry_after else {}
    if isinstance(exc, HttpError):
        return str(exc.message), exc.status_code, {}
    if isinstance(exc, Http404):
        return str(exc) or "Not found.", 404, {}
    if isinstance(exc, DataError):  # e.g. a NUL byte in a name: the database refuses the value itself
        return NUL_BYTES, 400, {}
    return None


def error_response(exc: Exception) -> JsonResponse:
    """For views outside ninja; re-raises what is not a refusal."""
    answer = refusal(exc)
    if answer is None:
        raise exc
    message, status, headers = answer
    return JsonResponse({"detail": message}, status=status, headers=headers)


def install_error_handlers(api: NinjaAPI, *, validation_as_text: bool = False) -> None:
    """`validation_as_text`: invalid input is a 400 with one string (popcorn-cli prints `detail` only when it is
    a string); otherwise ninja's 422 with the list of errors."""
    def answer(request, exc: Exception):
        found = refusal(exc)
        if found is None:
            log.exception("API error", exc_info=exc)
            found = "Internal server error; the organisers have been notified.", 500, {}
        message, status, headers = found
        response = api.create_response(request, {"detail": message}, status=status)
        for name, value in headers.items():
            response[name] = value
        return response

    for kind in (Refused, HttpError, Http404, DataError, Exception):
        api.add_exception_handler(kind, answer)
    if validation_as_text:
        @api.exception_handler(ValidationError)
        def validation_error(request, exc: ValidationError):
            parts = [f"{'.'.join(str(p) for p in e.get('loc', [])[1:]) or 'request'}: {e.get('msg')}"
                     for e in exc.errors]
            return api.create_response(request, {"detail": "Invalid request: " + "; ".join(parts)}, status=400)
