"""``gpupool simulate``: replay a trace through the scheduling engine with the deployed policy settings.

A thin wrapper over ``python -m scheduler.sim`` (``scheduler/sim/cli.py``): every option is passed through, and
``GPUPOOL_SCHEDULER_POLICY`` (the policy overrides this deployment runs with) is applied as ``--set`` overrides
unless ``--ignore-settings`` is given — so an operator sees the effect of a policy change before deploying it.
"""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Replay a cluster trace through the scheduler (see python -m scheduler.sim --help)."

    def add_arguments(self, parser):
        parser.add_argument("--ignore-settings", action="store_true", help="do not apply GPUPOOL_SCHEDULER_POLICY")
        parser.add_argument("sim_args", nargs="*", help="options for scheduler.sim, after --")

    def handle(self, *args, sim_args, ignore_settings, **options):
        from scheduler.sim.cli import main

        argv = list(sim_args)
        if not ignore_settings:
            for name, value in sorted((getattr(settings, "GPUPOOL_SCHEDULER_POLICY", {}) or {}).items()):
                argv += ["--set", f"{name}={value}"]
        code = main(argv)
        if code:
            raise CommandError(f"simulation failed with exit code {code}")
