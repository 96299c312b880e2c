"""Requests survive a lost database connection (a restart of PostgreSQL, `pg_terminate_backend`, a failover).

A connection is checked before it serves a request (settings: CONN_HEALTH_CHECKS, which also gives DB_POOL's
psycopg pool its `check` on checkout), so a connection that died while idle is replaced unseen. One that dies
while a request uses it fails that request; `DatabaseHealthMiddleware`, outermost, then closes the broken
connection and runs a safe request (GET, HEAD, OPTIONS) once more on a fresh one, and answers any other request,
or a second failure, 503 with Retry-After. Writes that belong together are one statement or one transaction
(a submission's are), so a write cut short is rolled back whole.

The failure reaches the middleware three ways: a view's exception (`process_exception`); the NinjaAPIs' handler,
which re-raises it (kernelbot.api_errors); and an inner middleware's, which Django turns into a 500 inside the
chain and reports through `got_request_exception`, where it is marked on the request."""

from __future__ import annotations

import contextlib
import logging
import sys

from django.core.signals import got_request_exception
from django.db import DatabaseError, InterfaceError, OperationalError, connections
from django.http import HttpRequest, HttpResponse, JsonResponse

try:
    from psycopg import Error as PsycopgError
except ImportError:  # pragma: no cover - SQLite-only installs
    PsycopgError = None

log = logging.getLogger(__name__)

RETRY_AFTER = 5  # seconds: a restarted PostgreSQL takes a few to accept connections again
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
MESSAGE = "The database connection was lost while handling this request. Try again in a few seconds."
JSON_PREFIXES = ("/api/", "/popcorn/")
# SQLSTATEs of a connection that is gone or refused (class 08: connection exceptions): the server shut the session
# (57P01 admin_shutdown: pg_terminate_backend or a fast shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now,
# 57P05 idle_session_timeout, 25P03 idle_in_transaction_session_timeout) or had no room for it (53300).
LOST_STATES = frozenset({"57P01", "57P02", "57P03", "57P05", "25P03", "53300"})
_MARK = "_kernelbot_db_lost"


def connection_lost(exc: BaseException | None) -> bool:
    """The error says the connection is gone (or none could be opened), not that the query was wrong."""
    if not isinstance(exc, OperationalError | InterfaceError):
        return False
    cause = exc.__cause__
    if cause is None:  # raised by Django itself, e.g. "connection already closed"
        return isinstance(exc, InterfaceError)
    if PsycopgError is None or not isinstance(cause, PsycopgError):  # SQLite's are about the file, not a connection
        return False
    state = cause.sqlstate  # None: the client lost the socket, could not connect, or the pool timed out
    return state is None or state.startswith("08") or state in LOST_STATES


def close_broken_connections() -> None:
    """Drop this thread's connections (a pooled one goes back to its pool, which discards it if it is broken), so
    the next query opens or checks out a working one."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is None or conn.in_atomic_block:
            continue
        with contextlib.suppress(DatabaseError):  # closing a dead socket may fail; it is dropped all the same
            conn.close()


def unavailable(request: HttpRequest) -> HttpResponse:
    headers = {"Retry-After": str(RETRY_AFTER)}
    if request.path.startswith(JSON_PREFIXES) or "json" in request.headers.get("Accept", ""):
        return JsonResponse({"detail": MESSAGE}, status=503, headers=headers)
    return HttpResponse(f"<!doctype html><title>Try again</title><h1>Try again in a moment</h1><p>{MESSAGE}</p>",
                        status=503, headers=headers, content_type="text/html; charset=utf-8")


def _mark_lost_connection(sender, request=None, **kwargs) -> None:
    if request is not None and connection_lost(sys.exc_info()[1]):
        setattr(request, _MARK, True)


got_request_exception.connect(_mark_lost_connection, dispatch_uid="kernelbot.dbhealth")


class DatabaseHealthMiddleware:
    """First in MIDDLEWARE, so that a retry runs the whole chain again (session, user, CSRF) on fresh
    connections."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if not getattr(request, _MARK, False):
            return response
        close_broken_connections()  # (the answer it replaces is a plain 500 or 503: nothing to close)
        if request.method in SAFE_METHODS:
            log.warning("database connection lost during %s %s; retrying it once", request.method, request.path)
            setattr(request, _MARK, False)
            response = self.get_response(request)
            if not getattr(request, _MARK, False):
                return response
            close_broken_connections()
        log.warning("database connection lost during %s %s; answered 503", request.method, request.path)
        return unavailable(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not connection_lost(exception):
            return None
        setattr(request, _MARK, True)
        close_broken_connections()  # before the inner middleware's responses touch the database again
        return unavailable(request)
