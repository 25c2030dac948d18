from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from audit.verification import verify_trail


class Command(BaseCommand):
    help = "Verify the audit trail: hash chains, seals, signed checkpoints, tombstones and the witness file."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument("--no-seals", action="store_true", help="skip opening every record's seal (faster)")

    def handle(self, *args, **options) -> None:
        report = verify_trail(check_seals=not options["no_seals"])
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), indent=2))
        else:
            for warning in report.warnings:
                self.stdout.write(self.style.WARNING(f"warning: {warning}"))
            for finding in report.findings:
                self.stdout.write(self.style.ERROR(f"{finding.kind.upper()}: {finding.stream}: {finding.message}"))
        summary = f"{report.records} records in {report.streams} streams, {report.checkpoints} checkpoints"
        if not report.ok:
            raise CommandError(f"audit trail FAILED verification: {len(report.findings)} problem(s); {summary}")
        self.stdout.write(self.style.SUCCESS(f"OK: {summary}"))
