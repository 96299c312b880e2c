"""Every API error is {"detail": "<message>"}: the one mapping from what the service layer refuses to an HTTP
answer, shared by /api/v1 and popcorn's polled routes (both NinjaAPIs) and popcorn's streamed route (a plain
view). Refusals keep their status (and a quota's Retry-After)."""

from __future__ import annotations

import logging

from django.core.exceptions import BadRequest, PermissionDenied, RequestDataTooBig, SuspiciousOperation
from django.db import DataError
from django.http import Http404, JsonResponse
from django.http.multipartparser import MultiPartParserError
from ninja import NinjaAPI
from ninja.errors import HttpError, ValidationError
from ninja.parser import Parser as JSONParser

from leaderboards.errors import Refused

from .dbhealth import connection_lost

log = logging.getLogger(__name__)
NUL_BYTES = "The request holds a NUL byte, which no name, text or path can contain."
MAX_OFFSET = 10**9


def check_offset(offset: int) -> None:
    if not 0 <= offset <= MAX_OFFSET:
        raise HttpError(400, f"offset must be between 0 and {MAX_OFFSET}; got {offset}.")


def data_error_message(exc: DataError) -> str:
    """The database refused a value itself: say which kind, not a guess (psycopg/sqlite messages differ)."""
    text = str(exc.__cause__ or exc).lower()
    if "nul" in text or "0x00" in text:
        return NUL_BYTES
    if "out of range" in text or "too large" in text or "too big" in text or "overflow" in text:
        return "A number in the request is too large to store or compare (at most 2^63 - 1)."
    if "too long" in text:
        return "A text value in the request is longer than its field allows."
    if "encoding" in text or "utf" in text or "character" in text:
        return "The request holds characters that cannot be stored (invalid or unsupported encoding)."
    return "The request holds a value the database cannot store or compare."


class NotAnObject(ValueError):
    """A body that is not a JSON object: every JSON body of both APIs is one (ninja would read `[]` as no fields,
    and says only "Cannot parse request body" of what is not JSON, e.g. a multipart body sent to a JSON route)."""


class ObjectBodies(JSONParser):
    def parse_body(self, request):
        try:
            data = super().parse_body(request)
        except ValueError as exc:  # not JSON, or not UTF-8
            raise NotAnObject(f"The request body must be a JSON object (Content-Type: application/json); this "
                              f"{request.content_type or 'body'} is not JSON ({exc}).") from None
        if not isinstance(data, dict):
            raise NotAnObject(f"The request body must be a JSON object, not {type(data).__name__} "
                              f"({request.body[:40].decode(errors='replace')}).")
        return data


def refusal(exc: Exception) -> tuple[str, int, dict[str, str]] | None:
    """(message, status, headers) for an exception that is an answer to the client; None for a server error."""
    if isinstance(exc, Refused):
        return exc.message, exc.status, {"Retry-After": str(exc.retry_after)} if exc.retry_after else {}
    if isinstance(exc, HttpError):  # ninja says "Cannot parse request body" for what the parser refused
        cause = exc.__cause__
        return str(cause if isinstance(cause, NotAnObject) else exc.message), exc.status_code, {}
    if isinstance(exc, Http404):
        return str(exc) or "Not found.", 404, {}
    if isinstance(exc, DataError):  # e.g. a NUL byte in a name: the database refuses the value itself
        return data_error_message(exc), 400, {}
    if isinstance(exc, MultiPartParserError):  # Django's own views answer these 400 too
        return f"The multipart body cannot be read: {exc}", 400, {}
    if isinstance(exc, RequestDataTooBig):
        return f"The request body is too large: {exc}", 413, {}
    if isinstance(exc, SuspiciousOperation | BadRequest):  # too many fields or files, …
        return f"Bad request: {exc}", 400, {}
    if isinstance(exc, PermissionDenied):  # e.g. allauth's login limits when the client's address is unknown
        return str(exc) or "Permission denied.", 403, {}
    return None


def error_response(exc: Exception) -> JsonResponse:
    """For views outside ninja; re-raises what is not a refusal."""
    answer = refusal(exc)
    if answer is None:
        raise exc
    message, status, headers = answer
    return JsonResponse({"detail": message}, status=status, headers=headers)


def install_error_handlers(api: NinjaAPI, *, validation_status: int = 422) -> None:
    """Invalid input is `validation_status` with one string naming each bad field (popcorn-cli prints `detail`
    only when it is a string, and wants a 400)."""
    api.parser = ObjectBodies()

    def answer(request, exc: Exception):
        found = refusal(exc)
        if found is None and connection_lost(exc):
            raise exc  # kernelbot.dbhealth: retried once if safe, else 503 with Retry-After
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
    @api.exception_handler(ValidationError)
    def validation_error(request, exc: ValidationError):
        parts = [f"{'.'.join(str(p) for p in e.get('loc', [])[1:]) or 'request'}: {e.get('msg')}"
                 for e in exc.errors]
        return api.create_response(request, {"detail": "Invalid request: " + "; ".join(parts)},
                                   status=validation_status)
