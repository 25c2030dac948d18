"""Database backends: Django's PostgreSQL and SQLite backends with a pre-commit hook (see ``precommit``)."""
