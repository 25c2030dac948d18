from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "tenants"
    verbose_name = "Tenants and identity"

    def ready(self) -> None:
        from tenants import schema, signals  # noqa: F401  (schema registers the OpenAPI auth scheme)

        signals.connect()
