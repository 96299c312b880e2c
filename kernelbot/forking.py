"""What a forked child must not inherit. django-q2 forks its workers, monitor and pusher from a process that has
used the database; with `DB_POOL=1` that parent holds a psycopg pool whose sockets the child would otherwise reuse,
so two processes would talk on one PostgreSQL session."""

import os
import socket
from pathlib import Path

from django.db import connections

# The parent's pools and connections, parked in the child and never touched again: closing them would end the
# parent's sessions (psycopg never terminates a connection opened by another process, but close() would), and a
# pool's finaliser takes locks a parent thread may have held at the fork.
_inherited: list[object] = []


def forget_inherited_connections() -> None:
    """Runs in every forked child (os.register_at_fork): the child opens its own connections and pool on first use."""
    ports = set()
    for alias in connections.settings:
        conn = connections[alias]
        if conn.vendor == "postgresql":
            ports.add(int(conn.settings_dict.get("PORT") or 5432))
        pools = getattr(type(conn), "_connection_pools", None)
        if pools:
            _inherited.extend(pools.values())
            pools.clear()
        if conn.connection is not None:
            _inherited.append(conn.connection)
            conn.connection = None
    if ports:
        _close_database_sockets(ports)


def _close_database_sockets(ports: set[int]) -> None:
    """Close this process's copies of the sockets to the database server (the parent's sessions go on: the kernel
    ends a connection only when its last copy closes), so no tool shows two processes on one connection."""
    try:
        descriptors = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: the sockets stay open, unused
        return
    for fd in descriptors:
        try:
            sock = socket.socket(fileno=fd)
        except OSError:  # not a socket (or already closed)
            continue
        try:
            peer = sock.getpeername()
        except OSError:
            peer = None
        finally:
            sock.detach()
        if (isinstance(peer, tuple) and peer[1] in ports) or \
                (isinstance(peer, str | bytes) and any(Path(os.fsdecode(peer)).name == f".s.PGSQL.{port}"
                                                       for port in ports)):
            os.close(fd)


def register() -> None:
    os.register_at_fork(after_in_child=forget_inherited_connections)
