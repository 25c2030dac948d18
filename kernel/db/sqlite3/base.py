"""Django's SQLite backend with the pre-commit hook of ``kernel.db.precommit``."""

from django.db.backends.sqlite3.base import DatabaseWrapper as _SQLiteWrapper

from kernel.db.precommit import PreCommitMixin


class DatabaseWrapper(PreCommitMixin, _SQLiteWrapper):
    pass
