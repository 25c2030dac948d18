from __future__ import annotations

from django.core.management.base import BaseCommand

from audit.services import checkpoint_all


class Command(BaseCommand):
    help = "Sign a checkpoint of every audit stream with new records now (beat does this periodically)."

    def handle(self, *args, **options) -> None:
        made = checkpoint_all()
        for checkpoint in made:
            self.stdout.write(f"{checkpoint.stream}: checkpoint at seq {checkpoint.seq}")
        self.stdout.write(self.style.SUCCESS(f"{len(made)} checkpoint(s) signed"))
