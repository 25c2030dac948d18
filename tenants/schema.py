"""OpenAPI (drf-spectacular) description of the Bearer token scheme. Kept apart from
``tenants.authentication`` because importing drf-spectacular there would be a circular import."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "tenants.authentication.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict:
        return {"type": "http", "scheme": "bearer", "bearerFormat": "gp_<prefix>_<secret>"}
