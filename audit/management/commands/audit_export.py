from __future__ import annotations

import datetime as dt
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.utils.dateparse import parse_date, parse_datetime

from audit.exports import build_bundle
from kernel.api import DomainError


def parse_moment(raw: str, *, end: bool = False) -> dt.datetime:
    """An ISO date (whole day; as ``--to`` it includes that day) or datetime (UTC when no offset)."""
    day = parse_date(raw) if len(raw) == 10 else None
    if day is not None:
        moment = dt.datetime.combine(day + dt.timedelta(days=1 if end else 0), dt.time())
    else:
        moment = parse_datetime(raw)
        if moment is None:
            raise CommandError(f"{raw!r} is not a date (2026-12-01) or datetime (2026-12-01T08:00:00Z)")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment


class Command(BaseCommand):
    help = "Export audit records as a signed bundle (zip) that `python -m audit.bundle_verifier` checks offline."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--from", dest="start", required=True, help="start date/datetime (inclusive)")
        parser.add_argument("--to", dest="end", required=True, help="end date (inclusive) or datetime (exclusive)")
        parser.add_argument("--tenant", type=int, default=None, help="only this tenant's stream")
        parser.add_argument("-o", "--output", required=True, help="where to write the bundle, e.g. bundle.zip")

    def handle(self, *args, **options) -> None:
        try:
            body, manifest = build_bundle(
                actor=None,
                start=parse_moment(options["start"]),
                end=parse_moment(options["end"], end=True),
                tenant_id=options["tenant"],
            )
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        Path(options["output"]).write_bytes(body)
        count = sum(s["records"] for s in manifest["streams"].values())
        self.stdout.write(
            self.style.SUCCESS(
                f"wrote {options['output']}: {count} records in {len(manifest['streams'])} streams, signed by key "
                f"{manifest['signing_key_id']}. Verify with the trust root you pinned at install (compare it with "
                f"{manifest['trust_root']}): python -m audit.bundle_verifier {options['output']} --trust-root "
                f"{manifest['trust_root']}"
            )
        )
