"""Quotas per tenant and flavor (checked against the tenant tree) and showback prices per flavor."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from audit.services import audit_record
from catalog.models import FlavorPrice
from kernel.access_rules import Action
from kernel.api import DomainError
from tenants import messages as tenants_messages
from tenants.access import allows
from tenants.models import QUOTA_FIELDS, QUOTA_STEP_MILLIS, Quota, Tenant, TenantStorageUsage, User
from tenants.permissions import ancestors_and_self
from tenants.selectors import subtree_q
from tenants.services.guards import ensure_may_write, require_permission

# --- quotas -----------------------------------------------------------------------------------------------


def _flavor_name(flavor: Any) -> str:
    return getattr(flavor, "name", str(flavor))


def quota_values_clean(values: dict, *, tenant: Tenant, flavor: Any) -> dict:
    """Check one quota's own numbers: no negatives, steps of 100 millis, limit ≥ guaranteed."""
    unknown = set(values) - set(QUOTA_FIELDS)
    if unknown:
        raise DomainError(tenants_messages.UNKNOWN_QUOTA_FIELD(fields=", ".join(sorted(unknown))))
    cleaned = {}
    for field in QUOTA_FIELDS:
        value = values.get(field)
        if field == "guaranteed_millis" or field == "guaranteed_memory_mib":
            value = 0 if value is None else value
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise DomainError(
                    tenants_messages.MUST_WHOLE_NUMBER_GOT(quota_field=field, value=repr(value)), field=field
                )
            if field.endswith("_millis") and value % QUOTA_STEP_MILLIS:
                raise DomainError(
                    tenants_messages.MUST_MULTIPLE_MILLIS_ONE_CARD(
                        quota_field=field, step=QUOTA_STEP_MILLIS, value=value
                    ),
                    field=field,
                )
        cleaned[field] = value
    where = f"{tenant.slug}/{_flavor_name(flavor)}"
    if cleaned["limit_millis"] is not None and cleaned["limit_millis"] < cleaned["guaranteed_millis"]:
        raise DomainError(
            tenants_messages.QUOTA_LIMIT_MILLIS_BELOW_GUARANTEED(
                where=where, limit=cleaned["limit_millis"], guaranteed=cleaned["guaranteed_millis"]
            ),
            code="quota_invalid",
            field="limit_millis",
        )
    return cleaned


def quota_path_lock(*, tenant: Tenant, flavor: Any) -> list[Tenant]:
    """Lock the tenant's ancestors (and itself), root first, and their quota rows for ``flavor``.

    Two changes anywhere under the same parent lock the same rows in the same order, so they run one after
    the other and the second re-checks against what the first committed; nothing is half-applied.
    """
    chain_ids = [node.pk for node in ancestors_and_self(tenant)]
    locked = list(Tenant.objects.select_for_update(no_key=True).filter(pk__in=chain_ids).order_by("depth"))
    list(
        Quota.objects.select_for_update(of=("self",), no_key=True)
        .filter(tenant_id__in=chain_ids, flavor=flavor)
        .order_by("tenant__depth")
    )
    return locked


def quota_tree_check(*, tenant: Tenant, flavor: Any, new: dict) -> None:
    """Σ children's guaranteed ≤ parent's guaranteed, where "parent" and "children" are the nearest tenants
    that hold a quota row for the flavor (a tenant without one is accounted to its nearest ancestor)."""
    root = ancestors_and_self(tenant)[-1]
    rows = {
        row.tenant_id: row
        for row in Quota.objects.filter(subtree_q([root.pk], prefix="tenant__"), flavor=flavor).select_related("tenant")
    }
    guaranteed = {tenant_id: row.guaranteed_millis for tenant_id, row in rows.items()}
    guaranteed[tenant.pk] = new["guaranteed_millis"]
    parents = dict(Tenant.objects.filter(subtree_q([root.pk])).values_list("pk", "parent_id"))
    slugs = dict(Tenant.objects.filter(subtree_q([root.pk])).values_list("pk", "slug"))

    def quota_parent(tenant_id: int) -> int | None:
        parent = parents.get(tenant_id)
        while parent is not None and parent not in guaranteed:
            parent = parents.get(parent)
        return parent

    children: dict[int, list[int]] = {}
    for tenant_id in guaranteed:
        parent = quota_parent(tenant_id)
        if parent is not None:
            children.setdefault(parent, []).append(tenant_id)
    flavor_name = _flavor_name(flavor)
    for parent, kids in children.items():
        total = sum(guaranteed[kid] for kid in kids)
        if total > guaranteed[parent]:
            parts = ", ".join(f"{slugs[kid]} {guaranteed[kid]}" for kid in sorted(kids, key=lambda k: slugs[k]))
            raise DomainError(
                tenants_messages.QUOTA_GUARANTEES_UNDER_ADD_UP(
                    flavor=flavor_name, parent=slugs[parent], total=total, parts=parts, guaranteed=guaranteed[parent]
                ),
                code="quota_exceeds_parent",
                field="guaranteed_millis",
            )


def quota_apply(*, actor: User | None, tenant: Tenant, flavor: Any, values: dict, request: Any = None) -> Any:
    """Validate and write one quota under row locks (no permission check: callers do that)."""
    cleaned = quota_values_clean(values, tenant=tenant, flavor=flavor)
    quota_path_lock(tenant=tenant, flavor=flavor)
    quota_tree_check(tenant=tenant, flavor=flavor, new=cleaned)
    quota = Quota.objects.filter(tenant=tenant, flavor=flavor).first()
    before = quota.values() if quota else None
    if quota is None:
        quota = Quota.objects.create(tenant=tenant, flavor=flavor, **cleaned)
    else:
        for field, value in cleaned.items():
            setattr(quota, field, value)
        quota.save()
    audit_record(
        action="quota.update" if before else "quota.create",
        actor=actor,
        tenant=tenant,
        target=f"quota:{tenant.slug}/{_flavor_name(flavor)}",
        details={"before": before, "after": cleaned},
        request=request,
    )
    return quota


@transaction.atomic
def quota_set(*, actor: User | None, tenant: Tenant, flavor: Any, values: dict, request: Any = None) -> Any:
    """Set a tenant's quota for a flavor directly (system admins; tenant admins go through
    ``quota_change_request_create``). Refused, with the numbers, if it breaks the tree's rules."""
    ensure_may_write(actor)
    if actor is not None:
        require_permission(
            allows(actor, Action.QUOTA_SET, tenant),
            tenants_messages.ONLY_SYSTEM_ADMIN_SETS_QUOTAS(),
        )
    return quota_apply(actor=actor, tenant=tenant, flavor=flavor, values=values, request=request)


@transaction.atomic
def flavor_price_set(
    *, actor: User | None, flavor: Any, price_per_device_hour: Any, currency: str = "CNY", request: Any = None
) -> Any:
    """Set the showback price of one card-hour of ``flavor`` (system admins)."""
    from decimal import Decimal, InvalidOperation

    ensure_may_write(actor)
    if actor is not None:
        require_permission(allows(actor, Action.PRICE_SET), tenants_messages.ONLY_SYSTEM_ADMIN_SETS_PRICES())
    try:
        price = Decimal(str(price_per_device_hour))
    except InvalidOperation:
        raise DomainError(tenants_messages.PRICE_PER_DEVICE_HOUR_MUST_NUMBER(), field="price_per_device_hour") from None
    if price < 0 or not price.is_finite():
        raise DomainError(tenants_messages.PRICE_PER_DEVICE_HOUR_MUST(), field="price_per_device_hour")
    existing = FlavorPrice.objects.filter(flavor=flavor).first()
    before = {"price": str(existing.price_per_device_hour), "currency": existing.currency} if existing else None
    row, _created = FlavorPrice.objects.update_or_create(
        flavor=flavor, defaults={"price_per_device_hour": price, "currency": currency.upper()[:3]}
    )
    audit_record(
        action="flavor.price.set",
        actor=actor,
        target=f"flavor:{flavor.pk}",
        details={"before": before, "after": {"price": str(price), "currency": row.currency}},
        request=request,
    )
    return row


def tenant_storage_usage_record(*, usage: dict[int, tuple[int, int]], measured_at: Any) -> int:
    """Store what each tenant's part of the shared storage holds (tenant id → (bytes, files)), as the worker
    measured it; tenants not in ``usage`` keep their last figure. Returns the rows written."""
    known = set(Tenant.objects.filter(pk__in=list(usage)).values_list("pk", flat=True))
    rows = [
        TenantStorageUsage(tenant_id=tenant_id, used_bytes=used, files=files, measured_at=measured_at)
        for tenant_id, (used, files) in sorted(usage.items())
        if tenant_id in known
    ]
    TenantStorageUsage.objects.bulk_create(
        rows,
        update_conflicts=True,
        unique_fields=["tenant"],
        update_fields=["used_bytes", "files", "measured_at"],
    )
    return len(rows)
