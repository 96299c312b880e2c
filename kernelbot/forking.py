"""What a forked child must not inherit. django-q2 forks its workers, monitor and pusher from a process that has
used the database; with `DB_POOL=1` that parent holds a psycopg pool whose sockets the child would otherwise reuse,
so two processes would talk on one PostgreSQL session."""

import os

from django.db import connections

# The parent's pools and connections, parked in the child and never touched again: closing them would end the
# parent's sessions, and a pool's finaliser takes locks a parent thread may have held at the fork. psycopg never
# terminates a connection opened by another process, so dropping the socket here is silent.
_inherited: list[object] = []


def forget_inherited_connections() -> None:
    """Runs in every forked child (os.register_at_fork): the child opens its own connections and pool on first use."""
    for alias in connections.settings:
        conn = connections[alias]
        pools = getattr(type(conn), "_connection_pools", None)
        if pools:
            _inherited.extend(pools.values())
            pools.clear()
        if conn.connection is not None:
            _inherited.append(conn.connection)
            conn.connection = None


def register() -> None:
    os.register_at_fork(after_in_child=forget_inherited_connections)
