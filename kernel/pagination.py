"""List pagination that refuses a malformed ``limit`` or ``offset`` instead of ignoring it.

DRF's ``LimitOffsetPagination`` answers ``?limit=abc`` or ``?offset=-3`` with the default page, so a client's
typo silently returns something else than it asked for (and a schema fuzzer sees a schema-violating request
accepted). Here such a request is a 400 ``{"code": "invalid", ...}`` naming the parameter, and the schema says
which values are accepted (``limit`` ≥ 1, ``offset`` ≥ 0).
"""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination, _positive_int
from rest_framework.request import Request


class StrictLimitOffsetPagination(LimitOffsetPagination):
    def _whole_number(self, request: Request, name: str, *, minimum: int) -> int | None:
        raw = request.query_params.get(name)
        if raw is None:
            return None
        try:
            return _positive_int(
                raw, strict=minimum > 0, cutoff=self.max_limit if name == self.limit_query_param else None
            )
        except ValueError:
            raise ValidationError({name: [f"must be a whole number of at least {minimum}, not {raw!r}."]}) from None

    def get_limit(self, request: Request) -> int | None:
        limit = self._whole_number(request, self.limit_query_param, minimum=1)
        return self.default_limit if limit is None else limit

    def get_offset(self, request: Request) -> int:
        return self._whole_number(request, self.offset_query_param, minimum=0) or 0

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            parameter["schema"]["minimum"] = 1 if parameter["name"] == self.limit_query_param else 0
        return parameters
