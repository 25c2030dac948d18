from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "tenants"
    verbose_name = "Tenants and identity"

    def ready(self) -> None:
        from audit.events import register_app_events
        from kernel.messages import labels_register
        from tenants import (
            audit_events,
            messages,  # noqa: F401  (registers the tenants' messages)
            schema,  # noqa: F401  (registers the OpenAPI auth scheme)
            signals,
        )
        from tenants.models import ApprovalKind, ApprovalStatus, ApprovalStepRole

        signals.connect()
        # An approver role (written with spaces in a sentence) and an approval's status read as their labels.
        labels_register("role", lambda: {role.value.replace("_", " "): role.label for role in ApprovalStepRole})
        labels_register("status", lambda: {status.value: status.label for status in ApprovalStatus})
        labels_register("kind", lambda: {kind.value: kind.label for kind in ApprovalKind})
        register_app_events(self.label, audit_events.EVENTS)
