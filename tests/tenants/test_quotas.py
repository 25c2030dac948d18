"""Quotas: validation rules of the tree, quota_usage, and direct changes by system admins."""

from __future__ import annotations

import pytest
from django.utils import timezone

from kernel.api import DomainError, PermissionDeniedError
from scheduler.models import Allocation
from scheduler.quota_usage import quota_usage
from tenants.models import Quota
from tenants.services.quotas import quota_set
from tests.scheduler.factories import DeviceFactory, FlavorFactory, JobFactory
from tests.tenants.conftest import audited

pytestmark = pytest.mark.django_db


def q(guaranteed: int, limit: int | None = None, **extra) -> dict:
    return {"guaranteed_millis": guaranteed, "limit_millis": limit, **extra}


@pytest.fixture
def flavor(db):
    return FlavorFactory()


@pytest.fixture
def quotas(world, flavor):
    """acme 8 cards; research 6; vision 3 (limit 5); nlp 2 (lends at most 1)."""
    quota_set(actor=None, tenant=world.acme, flavor=flavor, values=q(8000))
    quota_set(actor=None, tenant=world.research, flavor=flavor, values=q(6000))
    quota_set(actor=None, tenant=world.vision, flavor=flavor, values=q(3000, 5000))
    quota_set(actor=None, tenant=world.nlp, flavor=flavor, values=q(2000, lending_limit_millis=1000))
    return flavor


def allocate(tenant, flavor, millis: int, *, ended: bool = False, started=None) -> Allocation:
    device = DeviceFactory(flavor=flavor)
    job = JobFactory(tenant=tenant)
    return Allocation.objects.create(
        job=job,
        replica=0,
        tenant=tenant,
        flavor=flavor,
        device=device,
        node=device.node,
        millis=min(millis, 1000),
        started_at=started or timezone.now(),
        ended_at=timezone.now() if ended else None,
    )


def test_children_guarantees_may_not_exceed_parent(world, quotas):
    with pytest.raises(DomainError) as info:
        quota_set(actor=None, tenant=world.nlp, flavor=quotas, values=q(3500))
    message = info.value.message
    assert "acme-research" in message and "6500" in message and "6000" in message
    assert "acme-vision 3000" in message and "acme-nlp 3500" in message
    assert Quota.objects.get(tenant=world.nlp).guaranteed_millis == 2000


def test_lowering_a_parent_below_its_children_is_refused(world, quotas):
    with pytest.raises(DomainError, match="add up to 5000"):
        quota_set(actor=None, tenant=world.research, flavor=quotas, values=q(4000))


def test_team_without_parent_row_counts_against_nearest_ancestor(world, flavor):
    quota_set(actor=None, tenant=world.acme, flavor=flavor, values=q(2000))
    quota_set(actor=None, tenant=world.vision, flavor=flavor, values=q(1500))
    with pytest.raises(DomainError, match="under acme add up to 2500"):
        quota_set(actor=None, tenant=world.nlp, flavor=flavor, values=q(1000))


@pytest.mark.parametrize(
    ("values", "match"),
    [
        (q(2000, 1000), "below guaranteed_millis 2000"),
        (q(-100), "whole number"),
        (q(150), "multiple of 100"),
        ({"guaranteed_millis": 100, "colour": 1}, "Unknown quota field"),
    ],
)
def test_invalid_quota_values_are_refused(world, flavor, values, match):
    with pytest.raises(DomainError, match=match):
        quota_set(actor=None, tenant=world.globex, flavor=flavor, values=values)
    assert not Quota.objects.exists()


def test_only_system_admin_sets_quotas_directly(world, flavor):
    with pytest.raises(PermissionDeniedError):
        quota_set(actor=world.users["tenant_admin"], tenant=world.vision, flavor=flavor, values=q(100))
    quota = quota_set(actor=world.users["system_admin"], tenant=world.globex, flavor=flavor, values=q(1000))
    assert quota.guaranteed_millis == 1000
    [event] = audited("quota.create")
    assert event["details"]["after"]["guaranteed_millis"] == 1000 and event["details"]["before"] is None


def test_quota_usage_reports_use_borrowing_and_lending(world, quotas):
    for _ in range(4):
        allocate(world.vision, quotas, 1000)  # vision uses 4 cards: 1 above its 3-card guarantee
    allocate(world.vision, quotas, 1000, ended=True)  # finished: not in use
    vision = quota_usage(world.vision)[quotas.name]
    assert vision["guaranteed"] == 3000 and vision["in_use"] == 4000 and vision["borrowed"] == 1000
    # nlp lends at most 1 card; research has 1 unassigned card; vision already borrows 1.
    assert vision["available_to_borrow"] == 1000
    assert vision["running_jobs"] == 4
    nlp = quota_usage(world.nlp)[quotas.name]
    assert nlp["in_use"] == 0 and nlp["lent"] > 0 and nlp["borrowed"] == 0
    research = quota_usage(world.research)[quotas.name]
    assert research["in_use"] == 4000 and research["borrowed"] == 0


def test_quota_usage_is_capped_by_limit(world, quotas):
    for _ in range(5):
        allocate(world.vision, quotas, 1000)
    assert quota_usage(world.vision)[quotas.name]["available_to_borrow"] == 0
