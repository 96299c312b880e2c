"""The ENGINE with `DB_POOL=1` (settings): Django's PostgreSQL backend, except that a connection the pool hands out is
checked first and a dead one is swapped for a working one at once.

psycopg_pool's own `check` (what Django installs with CONN_HEALTH_CHECKS) waits 1, 2, 4, 8... s before it tries the
next connection after a dead one, so after a database restart, when every idle connection is dead, a request waited
up to the pool's 30 s timeout. Here the first dead connection sends the whole pool through `ConnectionPool.check()`
(each idle connection tested once, the dead ones replaced), and the request takes the next good or new one."""

import psycopg
from django.db.backends.postgresql import base
from psycopg_pool import ConnectionPool

ATTEMPTS = 3  # a dead connection, then the sweep's survivors or new ones: a third failure means the database is down


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params):
        connection = super().get_new_connection(conn_params)
        if self.pool is None:
            return connection
        for attempt in range(1, ATTEMPTS + 1):
            try:
                ConnectionPool.check_connection(connection)
            except psycopg.Error:
                self.pool.putconn(connection)  # broken: the pool discards it and opens a replacement
                if attempt == ATTEMPTS:
                    raise
                if attempt == 1:
                    self.pool.check()  # the idle ones most likely died with it: test them all now
                connection = super().get_new_connection(conn_params)
            else:
                return connection
