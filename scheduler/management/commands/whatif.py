"""``gpupool whatif --days 30 --set preemption=false``: replay this pool's last N days under the policy in
force and under the proposed settings, side by side (``scheduler.whatif_history``; docs/simulator.md#what-if)."""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from kernel.api import DomainError
from scheduler.management.commands.export_trace import moment
from scheduler.sim import whatif as sim_whatif
from scheduler.sim.policies import setting_names
from scheduler.whatif_history import whatif_run


class Command(BaseCommand):
    help = "Replay the last N days under the current policy and a proposed change, side by side."

    def add_arguments(self, parser):
        parser.add_argument("--days", type=float, default=30, help="window: the last N days (default 30)")
        parser.add_argument("--since", help="window start instead of --days (ISO date or date-time)")
        parser.add_argument("--until", help="window end (default now)")
        parser.add_argument(
            "--set",
            dest="pairs",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help=f"a proposed setting, repeatable; NAME is one of {', '.join(setting_names())}",
        )
        parser.add_argument("--per-tenant", action="store_true", help="also compare each tenant")
        parser.add_argument(
            "--json", dest="json_out", type=Path, help="write both sides' figures and hourly allocation here"
        )
        parser.add_argument("--chart", type=Path, help="write an SVG chart of the GPUs allocated per hour here")

    def handle(self, *args, days, since, until, pairs, per_tenant, json_out: Path | None, chart, **options):
        changes = {}
        for pair in pairs:
            name, sep, value = pair.partition("=")
            if not sep:
                raise CommandError(f"--set {pair!r}: expected NAME=VALUE, NAME one of {', '.join(setting_names())}")
            changes[name.strip()] = value
        try:
            result = whatif_run(
                actor=None,
                changes=changes,
                days=None if since else days,
                since=moment(since),
                until=moment(until),
                max_jobs=None,
            )
        except DomainError as exc:
            raise CommandError(exc.message) from None
        settings_text = ", ".join(f"{k}={sim_whatif.format_setting(v)}" for k, v in result.changes.items())
        self.stdout.write(f"{result.workload}: {result.jobs:,} jobs on {result.gpus:,} GPUs; proposed: {settings_text}")
        self.stdout.write(sim_whatif.format_table(result))
        if per_tenant:
            self.stdout.write("")
            self.stdout.write(sim_whatif.format_table(result, per_tenant=True))
        if json_out:
            json_out.write_text(json.dumps(result.as_dict(), indent=1, default=str) + "\n")
        if chart:
            chart.write_text(sim_whatif.svg(result))
