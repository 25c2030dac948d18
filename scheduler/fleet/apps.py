from django.apps import AppConfig


class FleetConfig(AppConfig):
    """Audit actions of this app (``agent.*``, ``node.*``) are registered in ``audit.events``."""

    name = "scheduler.fleet"
    label = "fleet"
    verbose_name = "Fleet: node agents, credentials and telemetry"
