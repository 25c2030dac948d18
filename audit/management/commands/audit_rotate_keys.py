from __future__ import annotations

from django.core.management.base import BaseCommand

from audit import conf
from audit.services import data_keys_rotate


class Command(BaseCommand):
    help = (
        "Re-wrap every audit data key under the newest master key in GPUPOOL_AUDIT_MASTER_KEYS. Records are not "
        "re-encrypted. Keep the old master key in the ring until this has run."
    )

    def handle(self, *args, **options) -> None:
        count = data_keys_rotate(actor=None)
        self.stdout.write(self.style.SUCCESS(f"re-wrapped {count} data key(s) under {conf.master_keys()[-1][0]}"))
