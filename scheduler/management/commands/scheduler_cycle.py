"""``gpupool scheduler_cycle``: run one scheduling cycle now and print what it decided (for operators)."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand

from scheduler.services.cycle import run_cycle


class Command(BaseCommand):
    help = "Run one scheduling cycle now (waits for nothing: returns at once if another cycle is running)."

    def handle(self, *args, **options) -> None:
        result = run_cycle()
        if not result.ran:
            self.stdout.write("another cycle is running; nothing done")
            return
        self.stdout.write(json.dumps(result.as_dict(), indent=2, sort_keys=True, default=str))
