"""What both tenant pages show (the tenants section's page of a tenant and the tenant admin's page): the
breadcrumb of ancestors, one quota bar per flavor, and the quota forms' flavors and starting values.
"""

from __future__ import annotations

from dataclasses import dataclass

from catalog.models import ResourceFlavor
from frontend.summaries import flavor_capacity
from scheduler.quota_usage import quota_usage
from tenants.models import Quota, Tenant


def tenant_ancestors(tenant: Tenant) -> list[Tenant]:
    """The tenants above ``tenant``, top first (the page's breadcrumb)."""
    chain = []
    node = tenant.parent
    while node is not None:
        chain.append(node)
        node = node.parent
    return list(reversed(chain))


@dataclass
class QuotaRow:
    """One flavor's quota and use, with the numbers a bar needs (millis)."""

    flavor: str
    guaranteed: int
    limit: int | None
    in_use: int
    borrowed: int
    lent: int
    available_to_borrow: int
    running_jobs: int
    max_running_jobs: int | None

    @property
    def scale(self) -> int:
        """The bar's full width: the limit, or (no limit) what the tenant could reach now."""
        if self.limit is not None:
            return max(self.limit, self.in_use, 1)
        return max(self.guaranteed + self.available_to_borrow, self.in_use, self.guaranteed, 1)


def quota_rows(tenant: Tenant) -> list[QuotaRow]:
    """One bar per flavor the tenant has a quota for."""
    usage = quota_usage(tenant)
    return [
        QuotaRow(
            flavor=name,
            guaranteed=row["guaranteed"],
            limit=row["limit"],
            in_use=row["in_use"],
            borrowed=row["borrowed"],
            lent=row["lent"],
            available_to_borrow=row["available_to_borrow"],
            running_jobs=row["running_jobs"],
            max_running_jobs=row["max_running_jobs"],
        )
        for name, row in usage.items()
    ]


def flavor_names() -> list[str]:
    """Every flavor's name, sorted: the choices of the quota forms."""
    return list(ResourceFlavor.objects.order_by("name").values_list("name", flat=True))


def current_quota_values(tenant: Tenant, flavor_name: str | None) -> dict:
    """The tenant's quota for ``flavor_name`` as the forms' initial values (empty: no quota yet)."""
    quota = Quota.objects.filter(tenant=tenant, flavor__name=flavor_name).first() if flavor_name else None
    return quota.values() if quota else {}


def quota_form_flavor(tenant: Tenant, asked: str | None, flavors: list[str]) -> str | None:
    """The flavor the request form opens on: the one asked for, else one the tenant has a quota for, else one
    with schedulable cards in the pool (not a flavor of 0 cards)."""
    if asked in flavors:
        return asked
    with_quota = Quota.objects.filter(tenant=tenant).order_by("flavor__name").values_list("flavor__name", flat=True)
    if with_quota:
        return with_quota[0]
    schedulable = [row.name for row in flavor_capacity() if row.capacity_millis > 0]
    return (schedulable or flavors or [None])[0]
