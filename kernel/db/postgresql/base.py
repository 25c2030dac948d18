"""Django's PostgreSQL backend with the pre-commit hook of ``kernel.db.precommit``, and connection pools that a
forked child does not inherit."""

import os

from django.db.backends.postgresql.base import DatabaseWrapper as _PostgresWrapper

from kernel.db.precommit import PreCommitMixin


class DatabaseWrapper(PreCommitMixin, _PostgresWrapper):
    pass


def _forget_inherited_pools() -> None:
    # A pool opened before a fork (a Celery prefork parent that touched the database, say) holds sockets the
    # parent still uses, and its maintenance threads did not survive the fork. The child starts its own pool on
    # first use. Nothing is closed here: closing would send the server a Terminate on the parent's connections.
    _PostgresWrapper._connection_pools.clear()


os.register_at_fork(after_in_child=_forget_inherited_pools)
