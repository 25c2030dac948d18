"""Django's SQLite backend with the pre-commit hook of ``portal.db.precommit``."""

from django.db.backends.sqlite3.base import DatabaseWrapper as _SQLiteWrapper

from portal.db.precommit import PreCommitMixin


class DatabaseWrapper(PreCommitMixin, _SQLiteWrapper):
    pass
