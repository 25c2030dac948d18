"""``gpupool simulate``: replay a trace through the scheduling engine with the deployed policy settings.

A thin wrapper over ``python -m scheduler.sim`` (``scheduler/sim/cli.py``): every option is passed through
(``gpupool simulate --trace-file jobs.csv --cluster-file cluster.csv``, or after ``--``), and
``GPUPOOL_SCHEDULER_POLICY`` (the policy overrides this deployment runs with) is applied as ``--set`` overrides
unless ``--ignore-settings`` is given — so an operator sees the effect of a policy change before deploying it.
"""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

# Options of this command itself (flags, no value); everything else on the command line is the simulator's.
OWN_FLAGS = frozenset({"--ignore-settings", "--traceback", "--no-color", "--force-color", "--skip-checks"})


class Command(BaseCommand):
    help = "Replay a cluster trace through the scheduler (see python -m scheduler.sim --help)."

    def run_from_argv(self, argv):
        # ``gpupool simulate --trace-file F`` without ``--``: the simulator's options go after a ``--`` so that
        # Django's parser does not refuse them as unknown.
        head, rest = argv[:2], argv[2:]
        if "--" not in rest:
            rest = [*(a for a in rest if a in OWN_FLAGS), "--", *(a for a in rest if a not in OWN_FLAGS)]
        super().run_from_argv([*head, *rest])

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
