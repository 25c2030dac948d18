"""Django's PostgreSQL backend with the pre-commit hook of ``portal.db.precommit``."""

from django.db.backends.postgresql.base import DatabaseWrapper as _PostgresWrapper

from portal.db.precommit import PreCommitMixin


class DatabaseWrapper(PreCommitMixin, _PostgresWrapper):
    pass
