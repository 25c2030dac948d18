"""``gpupool export_trace``: this pool's job history in gpupool's trace format, ready to replay.

Writes ``jobs``, ``cluster`` (the current inventory) and ``tenants`` (the current tenant tree and quotas) as
CSV or JSON Lines, and ``manifest.json``, into ``--out``; then prints the ``gpupool simulate`` command that
replays them. See docs/trace-format.md.
"""

from __future__ import annotations

from datetime import datetime, time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from kernel.api import DomainError
from scheduler.sim.traceformat import FORMATS
from scheduler.trace_export import trace_export, window_bounds


def moment(text: str | None) -> datetime | None:
    """An ISO date (midnight) or date-time; without a zone, the server's time zone."""
    if not text:
        return None
    parsed = parse_datetime(text)
    if parsed is None:
        day = parse_date(text)
        if day is None:
            raise CommandError(f"{text!r} is not a date (2026-03-01) or date-time (2026-03-01T08:00)")
        parsed = datetime.combine(day, time.min)
    return timezone.make_aware(parsed) if timezone.is_naive(parsed) else parsed


class Command(BaseCommand):
    help = "Export the jobs of a window (and the inventory and quota tree) in gpupool's trace format."

    def add_arguments(self, parser):
        parser.add_argument("--since", help="window start, ISO date or date-time (default: --days before --until)")
        parser.add_argument("--until", help="window end, exclusive (default: now)")
        parser.add_argument("--days", type=float, help="window length when --since is not given (default 30)")
        parser.add_argument("--out", type=Path, help="folder to write into (default trace-<since>-<until>)")
        parser.add_argument(
            "--format", dest="file_format", choices=FORMATS, default="csv", help="file format (default csv)"
        )

    def handle(self, *args, since, until, days, out, file_format, **options):
        try:
            start, end = window_bounds(days=days, since=moment(since), until=moment(until))
            window = trace_export(actor=None, since=start, until=end)
        except DomainError as exc:
            raise CommandError(exc.message) from None
        folder = out or Path(f"trace-{start:%Y%m%d}-{end:%Y%m%d}")
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in window.files(file_format).items():
            (folder / name).write_text(text, encoding="utf-8")
        self.stdout.write(
            f"{len(window.jobs)} jobs submitted {start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M} "
            f"({window.never_ran} never ran and are left out; {window.still_running} still running), "
            f"{len(window.nodes)} nodes, {len(window.tenants.tenants)} tenants → {folder}/"
        )
        self.stdout.write(
            f"replay: gpupool simulate --trace-file {folder / f'jobs.{file_format}'} "
            f"--cluster-file {folder / f'cluster.{file_format}'} --tenants-file {folder / f'tenants.{file_format}'}"
        )
