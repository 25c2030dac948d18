from __future__ import annotations

from django.core.management.base import BaseCommand

from audit import conf
from audit.services import records_purge


class Command(BaseCommand):
    help = (
        "Remove audit records older than GPUPOOL_AUDIT_RETENTION_DAYS and not under legal hold, up to a signed "
        "checkpoint, leaving a signed tombstone per stream."
    )

    def handle(self, *args, **options) -> None:
        tombstones = records_purge(actor=None)
        for tombstone in tombstones:
            self.stdout.write(f"{tombstone.stream}: purged through seq {tombstone.through_seq}")
        self.stdout.write(
            self.style.SUCCESS(f"{len(tombstones)} stream(s) purged (retention {conf.retention_days()} days)")
        )
