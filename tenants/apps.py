from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "tenants"
    verbose_name = "Tenants and identity"

    def ready(self) -> None:
        from audit.events import register_app_events
        from tenants import (
            audit_events,
            schema,  # noqa: F401  (registers the OpenAPI auth scheme)
            signals,
        )

        signals.connect()
        register_app_events(self.label, audit_events.EVENTS)
