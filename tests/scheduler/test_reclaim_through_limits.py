"""Issue 33, items 1 and 3, through the public API with the cycle service: the demo's story — bob's team borrows
NLP's idle H100 cards, carol (NLP) asks for 2 cards within NLP's guarantee while the department's limit is
nearly used — and the headroom the API, the CLI and the console show for it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from scheduler.fleet.services.workload_reports import workload_status_report
from scheduler.models import Allocation, Job, JobState
from scheduler.services.cycle import run_cycle
from tests.factories import client_for
from tests.scheduler.factories import FlavorFactory, MembershipFactory, UserFactory, node_with_devices

GRACE_S = 60
MIN_RUNTIME_S = 300
CYCLE_S = 10  # the cycles below are this far apart, at most


def _spec(tenant: str, **resources) -> dict:
    return {
        "name": "train",
        "tenant": tenant,
        "resources": {"flavors": ["sim-80g"], **resources},
        "command": ["python"],
        "preemptible": True,
    }


@pytest.fixture
def demo(db, no_cycle_requests, settings):
    """The demo's tree and quotas (portal/demo.py) on one 8-card node: acme and research are guaranteed and
    limited to the 8 cards, vision and NLP guaranteed 3 each and may borrow up to 8."""
    from tenants.models import MembershipRole
    from tenants.services.quotas import quota_set
    from tenants.services.tenancy import tenant_create

    settings.GPUPOOL_SCHEDULER_POLICY = {
        "min_runtime_before_preempt_s": MIN_RUNTIME_S,
        "grace_period_s": GRACE_S,
    }
    flavor = FlavorFactory()
    node = node_with_devices(8, name="sim-00")
    acme = tenant_create(actor=None, name="ACME", slug="acme", kind="company")
    research = tenant_create(actor=None, name="Research", slug="acme-research", kind="department", parent=acme)
    vision = tenant_create(actor=None, name="Vision", slug="acme-vision", parent=research)
    nlp = tenant_create(actor=None, name="NLP", slug="acme-nlp", parent=research)
    for tenant, guaranteed, limit in ((acme, 8000, 8000), (research, 8000, 8000), (vision, 3000, 8000)):
        quota_set(
            actor=None, tenant=tenant, flavor=flavor, values={"guaranteed_millis": guaranteed, "limit_millis": limit}
        )
    quota_set(actor=None, tenant=nlp, flavor=flavor, values={"guaranteed_millis": 3000, "limit_millis": 8000})
    users = {}
    for username, tenant, role in (
        ("alice", research, MembershipRole.TENANT_ADMIN),
        ("bob", vision, MembershipRole.MEMBER),
        ("carol", nlp, MembershipRole.MEMBER),
    ):
        users[username] = UserFactory(username=username)
        MembershipFactory(user=users[username], tenant=tenant, role=role)
    return {"node": node, "users": users, "nlp": nlp, "flavor": flavor}


def _submit(user, spec) -> int:
    response = client_for(user).post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def _job(user, pk: int) -> dict:
    response = client_for(user).get(f"/api/v1/jobs/{pk}/")
    assert response.status_code == 200
    return response.json()


def _borrowed_pool(demo, t0):
    """bob's 6-card job (3 cards above vision's guarantee), a card of alice's department, half a card of
    carol's: research holds 7.5 of its 8-card limit."""
    users = demo["users"]
    alice = _submit(users["alice"], {**_spec("acme-research", gpus=1), "preemptible": False})
    small = _submit(users["carol"], _spec("acme-nlp", millis=500, memory_mib=8192))
    bob = _submit(users["bob"], _spec("acme-vision", gpus=6))
    assert sorted(run_cycle(now=t0).placed) == sorted([alice, small, bob])
    assert sum(Allocation.objects.active().filter(job_id=bob).values_list("borrowed_millis", flat=True)) == 3000
    return bob


def _headroom(user, tenant) -> int:
    response = client_for(user).get(f"/api/v1/tenants/{tenant.pk}/quota-usage/")
    assert response.status_code == 200
    (row,) = response.json()
    return row["available_to_borrow"], row


def test_a_job_within_its_guarantee_reclaims_borrowed_use_through_the_parents_limit(demo):
    users = demo["users"]
    t0 = timezone.now()
    bob = _borrowed_pool(demo, t0)

    asked = t0 + timedelta(seconds=60)  # bob's job is 60 s old: protected by the minimum runtime
    carol = _submit(users["carol"], _spec("acme-nlp", gpus=2))
    assert run_cycle(now=asked).preempted == []
    waiting = _job(users["carol"], carol)
    assert waiting["pending_reason_code"] == "quota_limit"
    assert "acme-research" in waiting["pending_reason"]
    # The reason says what the wait is for and when it ends, not only that the limit is reached.
    assert "minimum runtime, in about 4 min" in waiting["pending_reason"]

    # The first cycle after bob's minimum runtime reclaims his borrowed job for carol.
    eligible = t0 + timedelta(seconds=MIN_RUNTIME_S + 1)
    assert run_cycle(now=eligible).preempted == [bob]
    assert Job.objects.get(pk=bob).state == JobState.PREEMPTING
    assert _job(users["carol"], carol)["pending_reason_code"] == "waiting_for_preemption"

    # bob's job stops at the end of its grace period; carol starts in the next cycle.
    workload_status_report(
        node=demo["node"], job_id=bob, replica=0, state="stopped", exit_code=None, last_checkpoint_at=None
    )
    started = eligible + timedelta(seconds=GRACE_S)
    assert run_cycle(now=started).placed == [carol]
    assert _job(users["carol"], carol)["state"] in ("admitted", "starting", "running")
    assert (started - asked).total_seconds() <= GRACE_S + MIN_RUNTIME_S + CYCLE_S
    # The requeued borrower does not take the room back.
    assert Job.objects.get(pk=bob).state == JobState.QUEUED


def test_headroom_counts_the_parents_limit_in_the_api_and_the_console(demo, client):
    users = demo["users"]
    _borrowed_pool(demo, timezone.now())
    # NLP has 2.5 cards of unused guarantee, but research is at 7.5/8: a job of at most 0.5 card passes the
    # parent's limit, so NLP can borrow nothing above its guarantee now.
    available, row = _headroom(users["carol"], demo["nlp"])
    assert (row["guaranteed"], row["in_use"]) == (3000, 500)
    assert available == 0
    # The figure is the scheduler's: a job borrowing above the guarantee is refused by the parent's limit.
    refused = _submit(users["carol"], _spec("acme-nlp", gpus=3))
    run_cycle(now=timezone.now())
    assert _job(users["carol"], refused)["pending_reason_code"] == "quota_limit"

    client.force_login(users["carol"])
    page = client.get(reverse("frontend:tenant-detail", args=[demo["nlp"].pk]))
    assert page.status_code == 200
    (quota,) = page.context["quotas"]
    assert quota.available_to_borrow == available
    html = page.content.decode()
    table = html[html.index('data-testid="quota-table"') :]
    cells = table.split("<td>")
    # Columns: guaranteed, in use, borrowed, lent, limit, could borrow now.
    assert cells[6].split("</td>")[0].strip() == "0"
