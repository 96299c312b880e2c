"""The agents' HTTP calls: retried with backoff while the platform is away, and never past a stop."""

from __future__ import annotations

import threading

import pytest

from runners.harness import agent


def unreachable(calls: list[str]):
    def transport(method, url, data, headers):
        calls.append(method)
        raise ConnectionRefusedError("connection refused")
    return transport


def test_a_connection_error_is_retried_with_backoff_then_raised():
    calls, pauses = [], []
    with pytest.raises(ConnectionRefusedError):
        agent.call(unreachable(calls), "http://platform/x", "token", {"a": 1}, pause=pauses.append)
    assert calls == ["POST"] * agent.RETRIES and pauses == [0.5, 1.0, 2.0, 4.0]


def test_a_stopping_agent_gives_up_at_once_instead_of_backing_off():
    calls, stopping = [], threading.Event()
    stopping.set()  # SIGTERM came while the platform was gone (a node agent passes its stopping event's wait)
    with pytest.raises(OSError, match="stopped while retrying"):
        agent.call(unreachable(calls), "http://platform/x", "token", pause=stopping.wait)
    assert calls == ["GET"]
