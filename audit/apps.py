from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "audit"
    verbose_name = "Audit trail"

    def ready(self) -> None:
        from audit import (
            checks,  # noqa: F401  (registers the system checks)
            messages,  # noqa: F401  (registers the audit trail's messages)
        )
        from audit.events import EVENTS, register_app_events

        register_app_events(self.label, EVENTS)
