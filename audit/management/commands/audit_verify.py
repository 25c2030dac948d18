from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from audit import conf
from audit.trail_verifier import verify_trail


class Command(BaseCommand):
    help = (
        "Verify the audit trail: hash chains, seals, signed checkpoints, tombstones, data-key destruction and the "
        "witness file (required: a missing, lagging or contradicting witness fails, exit 1)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument("--no-seals", action="store_true", help="skip opening every record's seal (faster)")
        parser.add_argument(
            "--no-witness",
            action="store_true",
            help="verify the database alone, saying loudly that there is no witness (cannot detect a consistent "
            "rewrite or a cut tail)",
        )

    def handle(self, *args, **options) -> None:
        no_witness = options["no_witness"]
        if no_witness:
            self.stderr.write(
                self.style.ERROR(
                    "NO WITNESS (--no-witness): checking the database alone. A database administrator can rewrite "
                    "the whole trail consistently or cut its tail, and this run cannot tell."
                )
            )
        report = verify_trail(check_seals=not options["no_seals"], witness_required=not no_witness)
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), indent=2))
        else:
            for warning in report.warnings:
                self.stdout.write(self.style.WARNING(f"warning: {warning}"))
            for finding in report.findings:
                where = f"{finding.stream}: " if finding.stream else ""
                self.stdout.write(self.style.ERROR(f"{finding.kind.upper()}: {where}{finding.message}"))
        summary = f"{report.records} records in {report.streams} streams, {report.checkpoints} checkpoints"
        witness_note = (
            "NO WITNESS" if no_witness else f"{report.witness_entries} witness entries in {conf.witness_path()}"
        )
        if not report.ok:
            raise CommandError(
                f"audit trail FAILED verification: {len(report.findings)} problem(s); {summary}; {witness_note}"
            )
        self.stdout.write(self.style.SUCCESS(f"OK: {summary}; {witness_note}"))
