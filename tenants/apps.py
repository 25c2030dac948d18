from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "tenants"
    verbose_name = "Tenants and identity"

    def ready(self) -> None:
        from tenants import schema, signals  # noqa: F401  (schema registers the OpenAPI auth scheme)

        signals.connect()
        _register_audit_events()


def _register_audit_events() -> None:
    from audit.events import register

    for code, description in [
        ("quota_request.request_changes", "Changes to a quota change request were asked for"),
        ("quota_request.resubmit", "A quota change request was resubmitted"),
        ("quota_request.cancel", "A quota change request was withdrawn"),
        ("quota_request.expire", "A quota change request expired"),
        ("quota_request.fail", "An approved quota change no longer fitted and was not applied"),
        ("approval.cancel", "An approval request was withdrawn"),
        ("approval.expire", "An approval request expired"),
        ("approval.create", "An approval was requested"),
        ("notification.failed", "A notification could not be delivered"),
        ("notification.retry", "An admin retried a notification"),
        ("flavor.price.set", "The showback price of a flavor was set"),
    ]:
        register(code, "approval", description)
