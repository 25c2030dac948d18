from __future__ import annotations

import json

import pytest

from scheduler.models import Job, JobState
from scheduler.services.jobs import job_submit
from tenants.models import MembershipRole, PlatformRole
from tests.frontend.factories import make_flavor, make_member, make_tenant, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    make_flavor("nvidia-h100-80g")
    acme = make_tenant("acme")
    vision = make_tenant("vision", parent=acme)
    nlp = make_tenant("nlp", parent=acme)
    return {
        "acme": acme,
        "vision": vision,
        "nlp": nlp,
        "bob": make_member(vision, username="bob"),
        "carol": make_member(nlp, username="carol"),
        "alice": make_member(acme, role=MembershipRole.TENANT_ADMIN, username="alice"),
    }


def submit(actor, tenant, name="train"):
    spec = {
        "name": name,
        "tenant": tenant.slug,
        "resources": {"flavors": ["nvidia-h100-80g"], "gpus": 1},
        "command": ["python", "train.py"],
    }
    return job_submit(actor=actor, spec=spec)


def test_member_submits_a_job_through_the_form(client, world):
    client.force_login(world["bob"])
    response = client.post(
        "/console/jobs/submit/",
        {
            "submit_form": "1",
            "f-tenant": "vision",
            "f-name": "resnet",
            "f-kind": "training",
            "f-priority_class": "normal",
            "f-preemptible": "on",
            "f-replicas": "1",
            "f-flavor": "nvidia-h100-80g",
            "f-size": "fraction",
            "f-millis": "500",
            "f-memory_gib": "10",
            "f-command": "python train.py --epochs 3",
        },
    )
    job = Job.objects.get(name="resnet")
    assert response.status_code == 302 and response["Location"] == f"/console/jobs/{job.pk}/"
    assert job.tenant == world["vision"] and job.submitter == world["bob"]
    assert job.millis_per_replica == 500 and job.memory_mib_per_replica == 10240
    assert job.command == ["python", "train.py", "--epochs", "3"]


def test_member_submits_pasted_json(client, world):
    client.force_login(world["bob"])
    spec = {"name": "from-json", "resources": {"flavors": ["nvidia-h100-80g"], "gpus": 2}, "command": ["sleep", "1"]}
    response = client.post("/console/jobs/submit/", {"submit_json": "1", "j-spec_json": json.dumps(spec)})
    assert response.status_code == 302
    assert Job.objects.get(name="from-json").millis_per_replica == 2000


def test_service_errors_show_next_to_the_field(client, world):
    client.force_login(world["bob"])
    spec = {"name": "bad", "resources": {"flavors": ["no-such-flavor"], "gpus": 1}, "command": ["x"]}
    response = client.post("/console/jobs/submit/", {"submit_json": "1", "j-spec_json": json.dumps(spec)})
    assert response.status_code == 200
    assert "unknown flavor" in response.content.decode()
    assert not Job.objects.filter(name="bad").exists()


def test_broken_json_is_explained(client, world):
    client.force_login(world["bob"])
    response = client.post("/console/jobs/submit/", {"submit_json": "1", "j-spec_json": "{nope"})
    assert "not valid JSON" in response.content.decode()


def test_job_list_shows_only_the_members_tenant(client, world):
    submit(world["bob"], world["vision"], name="vision-job")
    submit(world["carol"], world["nlp"], name="nlp-job")
    client.force_login(world["bob"])
    page = client.get("/console/jobs/").content.decode()
    assert "vision-job" in page and "nlp-job" not in page
    # The tenant admin of the parent sees the whole subtree.
    client.force_login(world["alice"])
    page = client.get("/console/jobs/").content.decode()
    assert "vision-job" in page and "nlp-job" in page


def test_another_tenants_job_page_is_404(client, world):
    job = submit(world["carol"], world["nlp"])
    client.force_login(world["bob"])
    assert client.get(f"/console/jobs/{job.pk}/").status_code == 404
    assert client.post(f"/console/jobs/{job.pk}/cancel/").status_code == 404
    assert Job.objects.get(pk=job.pk).state != JobState.CANCELLED


def test_job_page_explains_why_it_waits_and_lists_its_timeline(client, world):
    job = submit(world["bob"], world["vision"])
    client.force_login(world["bob"])
    page = client.get(f"/console/jobs/{job.pk}/").content.decode()
    assert 'data-testid="pending-reason"' in page
    assert "Queued" in page
    assert page.count("<li><strong>") >= 2  # submitted, queued


def test_job_page_says_how_often_it_was_preempted_and_when_it_no_longer_will_be(client, world):
    make_flavor("nvidia-a100-40g")
    job = submit(world["bob"], world["vision"])
    client.force_login(world["bob"])
    assert 'data-testid="job-preemptions"' not in client.get(f"/console/jobs/{job.pk}/").content.decode()
    Job.objects.filter(pk=job.pk).update(preemption_count=2)
    assert "preempted 2 times</span>" in client.get(f"/console/jobs/{job.pk}/").content.decode()
    Job.objects.filter(pk=job.pk).update(
        preemption_count=3, flavors=["nvidia-h100-80g", "nvidia-a100-40g"], any_flavor=True
    )
    page = client.get(f"/console/jobs/{job.pk}/").content.decode()
    assert "preempted 3 times (not preempted again)" in page
    assert "nvidia-h100-80g / nvidia-a100-40g (whichever fits the pool best)" in page
    chinese = client.get(f"/console/jobs/{job.pk}/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "已被抢占 3 次 (不会再被抢占)" in chinese


def test_submitter_cancels_their_job(client, world):
    job = submit(world["bob"], world["vision"])
    client.force_login(world["bob"])
    response = client.post(f"/console/jobs/{job.pk}/cancel/", {"reason": "wrong data"})
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED


def test_polling_a_finished_job_tells_htmx_to_stop(client, world):
    job = submit(world["bob"], world["vision"])
    client.force_login(world["bob"])
    client.post(f"/console/jobs/{job.pk}/cancel/")
    response = client.get(f"/console/jobs/{job.pk}/", headers={"HX-Request": "true"})
    assert response.status_code == 286
    assert b"<html" not in response.content


def test_job_list_filters_by_state_and_exports_csv(client, world):
    keep = submit(world["bob"], world["vision"], name="keep")
    gone = submit(world["bob"], world["vision"], name="gone")
    client.force_login(world["bob"])
    client.post(f"/console/jobs/{gone.pk}/cancel/")
    page = client.get("/console/jobs/?state=cancelled").content.decode()
    assert "gone" in page and f'/console/jobs/{keep.pk}/"' not in page
    csv_lines = client.get("/console/jobs/?state=queued&export=csv").content.decode().strip().splitlines()
    assert len(csv_lines) == 2 and ",keep," in csv_lines[1]


def test_jobs_are_hidden_from_security_admin(client, world):
    client.force_login(make_user(platform_role=PlatformRole.SECURITY_ADMIN))
    assert client.get("/console/jobs/").status_code == 404


def test_auditor_reads_every_job_as_the_api_does_and_cancels_none(client, world):
    """The access policy: an auditor reads every job (console and API alike) and changes nothing."""
    job = submit(world["carol"], world["nlp"], name="nlp-job")
    auditor = make_user(platform_role=PlatformRole.AUDITOR)
    client.force_login(auditor)
    assert "nlp-job" in client.get("/console/jobs/").content.decode()
    page = client.get(f"/console/jobs/{job.pk}/")
    assert page.status_code == 200 and page.context["can_cancel"] is False
    client.post(f"/console/jobs/{job.pk}/cancel/", {"reason": "audit"})
    job.refresh_from_db()
    assert job.state != JobState.CANCELLED
    assert client.get("/console/jobs/submit/").status_code == 403


def test_system_admin_sees_all_jobs_but_has_no_submit_form(client, world):
    submit(world["carol"], world["nlp"], name="nlp-job")
    client.force_login(make_user(platform_role=PlatformRole.SYSTEM_ADMIN))
    assert "nlp-job" in client.get("/console/jobs/").content.decode()
    # Like the API's 403: the page says why (separation of duties) instead of pretending not to exist.
    refused = client.get("/console/jobs/submit/")
    assert refused.status_code == 403 and "form" not in refused.context


def test_job_list_filters_by_state_group(client, world):
    submit(world["bob"], world["vision"], name="waiting-one")
    done = submit(world["bob"], world["vision"], name="done-one")
    client.force_login(world["bob"])
    client.post(f"/console/jobs/{done.pk}/cancel/")
    page = client.get("/console/jobs/?state=waiting").content.decode()
    assert "waiting-one" in page and "done-one" not in page
    page = client.get("/console/jobs/?state=finished").content.decode()
    assert "done-one" in page and "waiting-one" not in page


def test_a_member_lets_the_scheduler_pick_among_the_flavors(client, world):
    make_flavor("ascend-910b")
    client.force_login(world["bob"])
    page = client.get("/console/jobs/submit/").content.decode()
    assert 'value="*"' in page and "Any of them" in page

    response = client.post(
        "/console/jobs/submit/",
        {
            "submit_form": "1",
            "f-tenant": "vision",
            "f-name": "anywhere",
            "f-kind": "training",
            "f-priority_class": "normal",
            "f-replicas": "1",
            "f-flavor": "*",
            "f-size": "whole",
            "f-gpus": "1",
            "f-command": "python train.py",
        },
    )

    job = Job.objects.get(name="anywhere")
    assert response.status_code == 302
    assert job.any_flavor is True
    assert sorted(job.flavors) == ["ascend-910b", "nvidia-h100-80g"]


def test_with_one_flavor_the_form_offers_no_choice_of_any(client, world):
    client.force_login(world["bob"])
    assert 'value="*"' not in client.get("/console/jobs/submit/").content.decode()


def test_a_placed_serving_jobs_page_shows_its_ports_and_endpoint(client, world, settings):
    from scheduler.services.cycle import run_cycle
    from tests.frontend.factories import make_node

    settings.GPUPOOL_SCHEDULER_POLICY = {"require_quota": False}
    node = make_node("gpu-7", devices=2)
    node.address = "10.0.0.7"
    node.save(update_fields=["address"])
    spec = {
        "name": "serve",
        "tenant": "vision",
        "kind": "inference",
        "resources": {"flavors": ["nvidia-h100-80g"], "gpus": 1},
        "ports": [{"name": "http", "ready_path": "/health"}],
        "command": ["python3", "serve.py"],
    }
    job = job_submit(actor=world["bob"], spec=spec)
    assert run_cycle().placed == [job.pk]
    client.force_login(world["bob"])
    page = client.get(f"/console/jobs/{job.pk}/").content.decode()
    assert 'data-testid="job-ports"' in page and "MASTER_PORT" in page and "10.0.0.7" in page
    # No serving proxy configured (embedded mode): the endpoint lists the replica to call directly.
    assert 'data-testid="job-endpoints"' in page and "call a replica directly" in page
