from django.apps import AppConfig
from django.core import checks


class FleetConfig(AppConfig):
    """Audit actions of this app (``agent.*``, ``node.*``) are registered in ``audit.events``."""

    name = "scheduler.fleet"
    label = "fleet"
    verbose_name = "Fleet: node agents, credentials and telemetry"

    def ready(self) -> None:
        from scheduler.fleet.fencing import check_fence_timing

        checks.register(check_fence_timing)
