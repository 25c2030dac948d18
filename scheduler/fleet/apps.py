from django.apps import AppConfig
from django.core import checks


class FleetConfig(AppConfig):
    name = "scheduler.fleet"
    label = "fleet"
    verbose_name = "Fleet: node agents, credentials and telemetry"

    def ready(self) -> None:
        from audit.events import register_app_events
        from scheduler.fleet import audit_events
        from scheduler.fleet.fencing import check_fence_timing

        checks.register(check_fence_timing)
        register_app_events(self.label, audit_events.EVENTS)
