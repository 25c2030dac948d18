"""Shared set-up for the benchmarks that need Django: settings pointed at a scratch data dir and a migrated
database (a fresh SQLite file unless a database URL is given)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def setup_django(database_url: str | None, data_dir: str) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "portal.settings"
    os.environ["GPUPOOL_DATA_DIR"] = data_dir
    os.environ["GPUPOOL_AUDIT_WITNESS_PATH"] = str(Path(data_dir) / "witness.jsonl")
    os.environ.setdefault("GPUPOOL_LOG_LEVEL", "ERROR")
    if database_url:
        os.environ["GPUPOOL_DATABASE_URL"] = database_url
    else:
        os.environ.pop("GPUPOOL_DATABASE_URL", None)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
