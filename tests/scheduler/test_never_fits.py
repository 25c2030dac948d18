"""Issue 33, item 2: a job the pool or its quota tree can never give what it asks is refused at submit (400,
``job_never_fits``, naming the field and the largest shape there is), as ``sbatch`` refuses it; one that becomes
impossible later (a node removed, a quota cut) says so in its pending reason and tells its owner once."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from scheduler.core.types import PendingReason
from scheduler.fleet.models import Node
from scheduler.models import Job, JobState
from scheduler.services.cycle import run_cycle
from tenants.models import NotificationDelivery
from tests.scheduler.factories import (
    FlavorFactory,
    MembershipFactory,
    SystemAdminFactory,
    TenantFactory,
    UserFactory,
    node_with_devices,
)

FLAVOR = "sim-80g"
CARDS_PER_NODE = 8
CARD_MEMORY_MIB = 81920  # the factories' card
SPEC = {"name": "train", "tenant": "team-a", "resources": {"flavors": [FLAVOR], "gpus": 1}, "command": ["python"]}


@pytest.fixture
def pool(db):
    """Two registered nodes of eight sim-80g cards each."""
    return [node_with_devices(CARDS_PER_NODE, name=f"gpu-{i}") for i in range(2)]


@pytest.fixture
def alice(tenant):
    user = UserFactory(username="alice", email="alice@example.com")
    MembershipFactory(user=user, tenant=tenant, role="member")
    return user


@pytest.fixture
def api(alice, no_cycle_requests) -> APIClient:
    client = APIClient()
    client.force_authenticate(alice)
    return client


@pytest.fixture
def admin_api() -> APIClient:
    client = APIClient()
    client.force_authenticate(SystemAdminFactory())
    return client


def submit(api: APIClient, **changes):
    resources = changes.pop("resources", {})
    spec = {**SPEC, **changes, "resources": {**SPEC["resources"], **resources}}
    if "millis" in resources:
        spec["resources"].pop("gpus")
    return api.post("/api/v1/jobs/", spec, format="json")


def refused(response, field: str) -> dict:
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "job_never_fits", body
    assert list(body["errors"]) == [field], body
    assert body["detail"].startswith(f"{field}: never fits: "), body
    assert body["limit"]["field"] == field and body["limit"]["flavor"] == FLAVOR
    assert not Job.objects.exists()
    return body


# --- refused at submit ----------------------------------------------------------------------------------------------


def test_more_cards_per_replica_than_any_node_has_is_refused_naming_the_largest_node(pool, api):
    body = refused(submit(api, resources={"gpus": 64}), "resources.gpus")
    assert f"per-replica cards: 64 asked, the largest {FLAVOR} node has {CARDS_PER_NODE}" in body["detail"]
    assert (body["limit"]["bound"], body["limit"]["asked"], body["limit"]["largest"]) == (
        "cards_per_node",
        64,
        CARDS_PER_NODE,
    )


def test_more_replicas_than_the_pool_has_cards_is_refused_naming_the_pool(pool, api):
    body = refused(submit(api, replicas=256), "replicas")
    total = CARDS_PER_NODE * len(pool)
    assert f"the pool has {total} {FLAVOR} cards in all" in body["detail"]
    assert (body["limit"]["bound"], body["limit"]["largest"]) == ("cards_in_pool", total)


@pytest.mark.parametrize("memory_mib", [200 * 1024, 10 * 1024 * 1024])  # 200 GiB, 10 TiB on an 80 GiB card
def test_a_fraction_with_more_memory_than_any_card_is_refused(pool, api, memory_mib):
    body = refused(submit(api, resources={"millis": 300, "memory_mib": memory_mib}), "resources.memory_mib")
    assert f"memory_mib: {memory_mib} asked, the largest {FLAVOR} card has {CARD_MEMORY_MIB}" in body["detail"]
    assert (body["limit"]["asked"], body["limit"]["largest"], body["limit"]["unit"]) == (
        memory_mib,
        CARD_MEMORY_MIB,
        "MiB",
    )


def test_a_request_above_every_limit_up_the_quota_tree_is_refused_naming_the_tightest(pool, no_cycle_requests):
    parent = TenantFactory(slug="acme-research")
    child = TenantFactory(slug="team-a", parent=parent, depth=2)
    user = UserFactory()
    MembershipFactory(user=user, tenant=child, role="member")
    admin = APIClient()
    admin.force_authenticate(SystemAdminFactory())
    for tenant, limit in ((parent, 4000), (child, 8000)):
        body = {"tenant": tenant.pk, "flavor": FLAVOR, "guaranteed_millis": 1000, "limit_millis": limit}
        assert admin.post("/api/v1/quotas/", body, format="json").status_code in (200, 201)
    api = APIClient()
    api.force_authenticate(user)

    body = refused(submit(api, resources={"gpus": 6}), "resources.gpus")
    assert f"the tenant's quota tree allows at most 4 {FLAVOR} cards (limit of acme-research)" in body["detail"]
    assert (body["limit"]["bound"], body["limit"]["largest"], body["limit"]["tenant"]) == (
        "quota_limit",
        4,
        "acme-research",
    )
    # At the exact maximum the tree allows, it is accepted.
    assert submit(api, resources={"gpus": 4}).status_code == 201


def test_a_job_at_the_exact_maximum_of_the_pool_is_accepted(pool, api):
    whole = submit(api, replicas=len(pool), resources={"gpus": CARDS_PER_NODE, "memory_mib": CARD_MEMORY_MIB})
    assert whole.status_code == 201, whole.json()
    fraction = submit(api, resources={"millis": 300, "memory_mib": CARD_MEMORY_MIB})
    assert fraction.status_code == 201, fraction.json()
    assert Job.objects.filter(state=JobState.QUEUED).count() == 2


def test_an_array_of_impossible_jobs_is_refused_before_any_is_created(pool, api):
    response = api.post(
        "/api/v1/jobs/", {**SPEC, "resources": {"flavors": [FLAVOR], "gpus": 64}, "array": {"count": 5}}, format="json"
    )
    refused(response, "resources.gpus")


def test_a_flavor_no_node_has_registered_yet_is_accepted_and_waits_saying_so(db, api):
    # A fresh install: the flavor exists, no node has enrolled. Nothing is known to refuse against.
    FlavorFactory()
    response = submit(api, resources={"gpus": 64})
    assert response.status_code == 201, response.json()
    run_cycle()
    job = Job.objects.get(pk=response.json()["id"])
    assert job.pending_reason_code == PendingReason.NO_SUCH_FLAVOR
    assert FLAVOR in job.pending_message


# --- impossible later -----------------------------------------------------------------------------------------------


def never_fits_deliveries() -> list[NotificationDelivery]:
    return list(NotificationDelivery.objects.filter(event="job.never_fits"))


def test_a_job_that_a_removed_node_makes_impossible_says_so_and_its_owner_is_told_once(pool, api, alice):
    busy = submit(api, resources={"gpus": 1})  # submitted first, it takes a card: the gang waits
    assert busy.status_code == 201
    created = submit(api, replicas=len(pool), resources={"gpus": CARDS_PER_NODE})
    assert created.status_code == 201, created.json()
    run_cycle()
    job = Job.objects.get(pk=created.json()["id"])
    assert job.state == JobState.QUEUED and job.pending_reason_code != PendingReason.NEVER_FITS
    assert never_fits_deliveries() == []

    # An operator removes one node. No service or page deletes a node yet (the Django admin is read-only), so
    # the row goes as an operator's shell would remove it.
    Node.objects.filter(name="gpu-1").delete()

    for _ in range(3):  # several cycles: one notification, not one per cycle
        run_cycle()
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    assert job.pending_reason_code == PendingReason.NEVER_FITS
    assert f"cards at once: 16 asked (2 x 8), the pool has {CARDS_PER_NODE} {FLAVOR} cards in all" in (
        job.pending_message
    )
    shown = api.get(f"/api/v1/jobs/{job.pk}/").json()
    assert shown["pending_reason_code"] == "never_fits", shown
    (delivery,) = never_fits_deliveries()
    assert [r["username"] for r in delivery.recipients] == ["alice"]
    assert f"Job {job.pk}" in delivery.subject and "the pool has 8" in delivery.body


def test_a_job_that_a_quota_cut_makes_impossible_says_so_and_its_owner_is_told_once(pool, api, tenant, admin_api):
    body = {"tenant": tenant.pk, "flavor": FLAVOR, "guaranteed_millis": 2000, "limit_millis": 8000}
    assert admin_api.post("/api/v1/quotas/", body, format="json").status_code in (200, 201)
    blocker = submit(api, resources={"gpus": 4})  # submitted first, it runs: 6 more would be over the limit of 8
    assert blocker.status_code == 201
    created = submit(api, resources={"gpus": 6})
    assert created.status_code == 201, created.json()
    run_cycle()
    run_cycle()
    job = Job.objects.get(pk=created.json()["id"])
    assert job.state == JobState.QUEUED and job.pending_reason_code == PendingReason.QUOTA_LIMIT
    assert never_fits_deliveries() == []

    cut = {**body, "limit_millis": 5000}
    assert admin_api.post("/api/v1/quotas/", cut, format="json").status_code in (200, 201)
    run_cycle()
    run_cycle()
    job.refresh_from_db()
    assert job.pending_reason_code == PendingReason.NEVER_FITS
    assert f"the tenant's quota tree allows at most 5 {FLAVOR} cards (limit of team-a), this job asks 6" in (
        job.pending_message
    )
    assert len(never_fits_deliveries()) == 1
