"""Serving endpoints without Caddy running (scheduler/serving.py): the named ports' validation, which replicas are
in an endpoint's route, the route Caddy gets, and that a stop syncs the proxy before the node hears of it."""

from __future__ import annotations

import pytest

from scheduler import serving
from scheduler.core import types as core
from scheduler.fleet import outbox
from scheduler.jobspec import JobSpecError, validate_job_spec
from scheduler.models import Job, JobState
from scheduler.persist import persist_plan
from scheduler.services.jobs import job_submit
from tests.scheduler.factories import node_with_devices

pytestmark = pytest.mark.django_db

SERVICE = {
    "name": "svc",
    "tenant": "team-a",
    "kind": "inference",
    "replicas": 2,
    "min_replicas": 1,
    "max_replicas": 2,
    "resources": {"flavors": ["sim-80g"], "gpus": 1},
    "ports": [{"name": "http", "ready_path": "/health"}],
    "command": ["python3", "serve.py"],
}


@pytest.fixture(autouse=True)
def _quiet(no_cycle_requests):
    return no_cycle_requests


@pytest.mark.parametrize(
    ("ports", "field"),
    [
        ([{"name": "HTTP"}], "ports[0].name"),
        ([{"name": "http"}, {"name": "http"}], "ports[1].name"),
        ([{"name": "http", "ready_path": "health"}], "ports[0].ready_path"),
        ([{"name": "http", "tls": True}], "ports[0].tls"),
        ([{"name": "replica"}], "ports[0].name"),
        ("http", "ports"),
    ],
)
def test_a_bad_named_port_is_refused_naming_the_field(ports, field, flavor):
    with pytest.raises(JobSpecError) as refused:
        validate_job_spec({**SERVICE, "ports": ports})
    assert refused.value.field == field


def _placed_service(member) -> Job:
    node = node_with_devices(2, name="gpu-a", address="10.2.0.1")
    job = job_submit(actor=member, spec=SERVICE)
    devices = list(node.devices.order_by("index"))
    place = core.Place(
        job_id=str(job.pk),
        tenant="team-a",
        flavor="sim-80g",
        assignments=tuple(core.Assignment(r, node.name, devices[r].uuid, 1000, 0) for r in range(2)),
    )
    persist_plan(core.Plan(places=(place,)))
    job.refresh_from_db()
    return job


def test_an_endpoint_routes_to_the_replicas_that_serve_and_not_to_one_scaled_down(member, flavor):
    job = _placed_service(member)
    (endpoint,) = serving.endpoints_desired()
    assert endpoint.job_id == job.pk and endpoint.ready_path == "/health" and len(endpoint.upstreams) == 2
    assert all(up.startswith("10.2.0.1:") for up in endpoint.upstreams)
    Job.objects.filter(pk=job.pk).update(scaling_down_replicas=[1])
    (endpoint,) = serving.endpoints_desired()
    assert len(endpoint.upstreams) == 1
    Job.objects.filter(pk=job.pk).update(state=JobState.PREEMPTING)
    assert serving.endpoints_desired() == []


def test_the_route_checks_access_with_the_portal_and_strips_credentials(member, flavor, settings):
    settings.GPUPOOL_SERVING_PORTAL = ["10.9.0.1:8000"]
    job = _placed_service(member)
    route = serving.caddy_route(serving.endpoints_desired())
    assert route["@id"] == serving.ROUTE_ID
    (endpoint, not_found) = route["handle"][0]["routes"]
    strip, handlers = endpoint["handle"][0]["routes"]
    assert strip["handle"][0]["strip_path_prefix"] == f"/serve/jobs/{job.pk}/http"
    auth, headers, upstream = handlers["handle"]
    assert auth["upstreams"] == [{"dial": "10.9.0.1:8000"}]
    assert auth["rewrite"]["uri"] == f"/api/v1/serving/auth/{job.pk}/http/"
    assert headers["request"]["delete"] == ["Authorization", "Cookie"]
    assert upstream["health_checks"]["active"]["uri"] == "/health"
    assert not_found["handle"][0]["status_code"] == 404


def test_a_preempted_replica_leaves_the_route_before_its_node_hears_of_the_stop(
    member, flavor, settings, django_capture_on_commit_callbacks
):
    settings.GPUPOOL_SERVING_CADDY_ADMIN = "http://127.0.0.1:9"  # configured; nothing is called here
    job = _placed_service(member)
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    preempt = core.Preempt(job_id=str(job.pk), reason=core.PreemptReason.PRIORITY, victim_of="999", grace_s=30.0)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        persist_plan(core.Plan(preemptions=(preempt,)))
    names = [getattr(callback, "__qualname__", repr(callback)) for callback in callbacks]
    sync = names.index("serving_sync")
    announce = next(i for i, name in enumerate(names) if "announce_after_commit" in name)
    assert sync < announce, names


def test_a_stopped_serving_replica_gets_a_drain_before_its_sigterm_and_a_batch_job_does_not(member, flavor, settings):
    # Caddy may have matched a request under the old route just before the sync; the replica must still answer it.
    settings.GPUPOOL_SERVING_CADDY_ADMIN = "http://127.0.0.1:9"
    settings.GPUPOOL_SERVING_DRAIN_S = 3.5
    job = _placed_service(member)
    (node_id,) = set(job.allocations.values_list("node_id", flat=True))
    stop = outbox.workload_stop_create(job=job, replica=1, node_id=node_id, reason="scale_down")
    assert stop.payload["drain_s"] == 3.5 and stop.payload["grace_s"] == 30.0

    Job.objects.filter(pk=job.pk).update(spec={**job.spec, "ports": []})
    job.refresh_from_db()
    assert outbox.workload_stop_create(job=job, replica=1, node_id=node_id).payload["drain_s"] == 0.0
    settings.GPUPOOL_SERVING_CADDY_ADMIN = ""  # embedded mode: no proxy to drain from
    job.refresh_from_db()
    Job.objects.filter(pk=job.pk).update(spec={**job.spec, "ports": [{"name": "http"}]})
    job.refresh_from_db()
    assert outbox.workload_stop_create(job=job, replica=1, node_id=node_id).payload["drain_s"] == 0.0
