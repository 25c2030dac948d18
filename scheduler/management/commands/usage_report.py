"""``gpupool usage_report --from 2026-11-01 --to 2026-12-01 [--period month] [--format csv|xlsx]``."""

from __future__ import annotations

import datetime as dt

from django.core.management.base import BaseCommand, CommandError, CommandParser

from scheduler.showback import PERIODS, report_csv, report_xlsx, usage_report
from tenants.models import Tenant
from tenants.selectors import tenant_subtree_ids


def _moment(text: str) -> dt.datetime:
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise CommandError(f"{text!r} is not a date; use YYYY-MM-DD or an ISO 8601 time.") from None
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


class Command(BaseCommand):
    help = "Showback report: device-hours (and cost) per tenant, flavor, user and job."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--from", dest="start", required=True, help="start (inclusive), e.g. 2026-11-01")
        parser.add_argument("--to", dest="end", required=True, help="end (exclusive), e.g. 2026-12-01")
        parser.add_argument("--period", choices=PERIODS, default="day")
        parser.add_argument("--format", choices=["csv", "xlsx"], default="csv")
        parser.add_argument("--detail", action="store_true", help="CSV: one row per user and job")
        parser.add_argument("--tenant", help="slug: only this tenant's subtree")
        parser.add_argument("--output", "-o", help="file to write (default: stdout; required for xlsx)")

    def handle(
        self,
        *args,
        start: str,
        end: str,
        period: str,
        format: str,
        detail: bool,
        tenant: str | None,
        output: str | None,
        **options,
    ) -> None:
        tenant_ids = None
        if tenant:
            root = Tenant.objects.filter(slug=tenant).first()
            if root is None:
                raise CommandError(f"No tenant with slug {tenant!r}.")
            tenant_ids = tenant_subtree_ids(root)
        try:
            report = usage_report(start=_moment(start), end=_moment(end), period=period, tenant_ids=tenant_ids)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if format == "xlsx":
            if not output:
                raise CommandError("--format xlsx needs --output FILE.xlsx")
            with open(output, "wb") as handle:
                handle.write(report_xlsx(report))
            self.stdout.write(f"Wrote {output}: {len(report.tenants)} tenant rows, {len(report.rows)} detail rows.")
            return
        text = report_csv(report, kind="detail" if detail else "tenants")
        if output:
            with open(output, "w", newline="") as handle:
                handle.write(text)
        else:
            self.stdout.write(text, ending="")
