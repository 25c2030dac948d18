"""Inference services on the database: reservations persisted, scale on load, reclaim from training."""

import pytest
from rest_framework.test import APIClient

from kernel.api import DomainError
from scheduler.core import types as core
from scheduler.fleet.models import AgentCommand
from scheduler.fleet.services.workload_reports import jobs_awaiting_stop_sweep, workload_status_report
from scheduler.models import Allocation, InferenceReservation, Job, JobEvent, JobState
from scheduler.services.cycle import run_cycle
from scheduler.services.jobs import job_cancel, job_submit
from scheduler.services.scaling import desired_replicas, inference_load_report, job_scale
from scheduler.snapshot import build_snapshot
from tests.scheduler.factories import MembershipFactory, TenantFactory, UserFactory

SERVICE = {
    "name": "chat",
    "tenant": "team-a",
    "kind": "inference",
    "preemptible": False,
    "replicas": 1,
    "min_replicas": 1,
    "max_replicas": 2,
    "resources": {"flavors": ["sim-80g"], "gpus": 1},
    "command": ["serve"],
}
TRAINING = {"name": "train", "tenant": "team-a", "resources": {"flavors": ["sim-80g"], "gpus": 1}, "command": ["py"]}


@pytest.fixture(autouse=True)
def _quiet(no_cycle_requests):
    return no_cycle_requests


def _report(job: Job, replica: int, state: str) -> None:
    allocation = Allocation.objects.active().filter(job=job, replica=replica).first()
    workload_status_report(
        node=allocation.node, job_id=job.pk, replica=replica, state=state, exit_code=None, last_checkpoint_at=None
    )


@pytest.fixture
def service(member, node, monkeypatch):
    """A running service with one replica on node-a's first free card and the other card reserved."""
    # Non-preemptible work needs a guarantee: team-a's covers the service, its reservation and training.
    quotas = (core.Quota(tenant="team-a", flavor="sim-80g", guaranteed_millis=4000),)
    monkeypatch.setattr("scheduler.snapshot.quotas_build", lambda _rows: quotas)
    job = job_submit(actor=member, spec=SERVICE)
    assert run_cycle().placed == [job.pk]
    _report(job, 0, "running")
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    return job


def test_placing_a_service_persists_its_reservation_and_feeds_it_back(service):
    (reservation,) = InferenceReservation.objects.all()
    running_on = Allocation.objects.active().get(job=service).device
    assert (reservation.job_id, reservation.replica, reservation.millis) == (service.pk, 1, 1000)
    assert reservation.device != running_on
    (core_reservation,) = build_snapshot().reservations
    assert (core_reservation.job_id, core_reservation.device_uuid) == (str(service.pk), reservation.device.uuid)
    # The reserved card is not free for ordinary work: an interactive job waits.
    other = job_submit(actor=None, spec={**TRAINING, "kind": "interactive", "preemptible": False})
    assert run_cycle().placed == []
    assert Job.objects.get(pk=other.pk).state == JobState.QUEUED


def test_training_on_the_idle_reservation_is_reclaimed_when_the_service_scales_up_on_load(member, service):
    reserved_device = InferenceReservation.objects.get().device
    training = job_submit(actor=member, spec=TRAINING)
    assert run_cycle().placed == [training.pk]
    borrowed = Allocation.objects.active().get(job=training)
    assert (borrowed.device, borrowed.reservation_of_id) == (reserved_device, service.pk)
    _report(training, 0, "running")

    # Load above the target: one replica at 1.4 → two replicas (ceil(1 * 1.4 / 0.7)).
    scaled = inference_load_report(job=service, load=1.4, actor=member)
    assert scaled.replicas == 2
    assert JobEvent.objects.filter(job=service, reason="scale").exists()

    result = run_cycle()
    assert result.preempted == [training.pk] and result.placed == []
    training.refresh_from_db()
    assert training.state == JobState.PREEMPTING
    assert training.events.get(to_state=JobState.PREEMPTING).reason == "reservation_reclaim"
    assert AgentCommand.objects.filter(job=training, command_type="workload.stop").count() == 1
    # While the training job checkpoints and stops, the next cycle preempts nothing more.
    assert run_cycle().preempted == []

    _report(training, 0, "stopped")
    assert Job.objects.get(pk=training.pk).state == JobState.QUEUED

    result = run_cycle()
    assert result.placed == [service.pk]
    new_replica = Allocation.objects.active().get(job=service, replica=1)
    assert new_replica.device == reserved_device and new_replica.reservation_of_id is None
    assert not InferenceReservation.objects.exists()  # the replica took its reservation over
    starts = AgentCommand.objects.filter(job=service, command_type="workload.start")
    assert sorted(c.payload["replica"] for c in starts) == [0, 1]
    assert Job.objects.get(pk=service.pk).state == JobState.RUNNING
    assert Job.objects.get(pk=training.pk).state == JobState.QUEUED  # nowhere to go: the pool is full


def test_scaling_down_stops_the_highest_replica_and_its_card_becomes_the_reservation(member, service):
    job_scale(job=service, replicas=2, actor=member)
    assert run_cycle().placed == [service.pk]
    _report(service, 1, "running")
    assert not InferenceReservation.objects.exists()

    # Load well below the target: two replicas at 0.2 → one.
    inference_load_report(job=service, load=0.2, actor=member)
    stop = AgentCommand.objects.get(job=service, command_type="workload.stop")
    assert (stop.payload["replica"], stop.payload["reason"]) == (1, "scale_down")
    freed = Allocation.objects.active().get(job=service, replica=1).device

    _report(service, 1, "stopped")
    service.refresh_from_db()
    assert service.state == JobState.RUNNING and service.replicas == 1 and service.scaling_down_replicas == []
    assert list(Allocation.objects.active().filter(job=service).values_list("replica", flat=True)) == [0]
    (reservation,) = InferenceReservation.objects.all()
    assert (reservation.replica, reservation.device) == (1, freed)


def test_a_scale_down_stop_the_agent_never_confirms_is_taken_as_done_after_the_timeout(member, service):
    job_scale(job=service, replicas=2, actor=member)
    assert run_cycle().placed == [service.pk]
    job_scale(job=service, replicas=1, actor=member)
    assert jobs_awaiting_stop_sweep(older_than_s=3600) == 0  # not yet
    assert jobs_awaiting_stop_sweep(older_than_s=0) == 1
    service.refresh_from_db()
    assert service.scaling_down_replicas == [] and service.state == JobState.RUNNING
    assert list(Allocation.objects.active().filter(job=service).values_list("replica", flat=True)) == [0]
    assert InferenceReservation.objects.get().replica == 1


def test_a_cancelled_service_releases_its_reservation_and_borrowers_keep_running(member, service):
    training = job_submit(actor=member, spec=TRAINING)
    assert run_cycle().placed == [training.pk]
    job_cancel(job=service, actor=member)
    assert not InferenceReservation.objects.exists()
    borrowed = Allocation.objects.active().get(job=training)
    assert borrowed.reservation_of_id is None
    (allocation,) = build_snapshot().allocations
    assert allocation.reservation_of is None  # counted on its card like any other work now


def test_load_within_the_tolerance_of_the_target_changes_nothing(member, service):
    assert inference_load_report(job=service, load=0.75, actor=member).replicas == 1


@pytest.mark.parametrize(
    ("running", "load", "expected"),
    [(1, 1.4, 2), (2, 0.2, 1), (3, 0.7, 3), (2, 3.0, 3), (3, 0.0, 1), (1, 0.72, 1)],
)
def test_desired_replicas_keeps_the_target_load_within_bounds(running, load, expected):
    assert desired_replicas(running=running, load=load, least=1, most=3) == expected


def test_a_service_cannot_be_scaled_past_max_replicas_or_a_training_job_at_all(member, service):
    with pytest.raises(DomainError) as exc:
        job_scale(job=service, replicas=3, actor=member)
    assert exc.value.code == "invalid_replicas"
    training = job_submit(actor=member, spec=TRAINING)
    with pytest.raises(DomainError) as exc:
        job_scale(job=training, replicas=2, actor=member)
    assert exc.value.code == "not_scalable"


def _client(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_scale_and_load_endpoints_follow_job_permissions(member, service, tenant):
    viewer = UserFactory(username="viewer-a")
    MembershipFactory(user=viewer, tenant=tenant, role="viewer")
    outsider = UserFactory(username="member-b")
    MembershipFactory(user=outsider, tenant=TenantFactory(slug="team-b"), role="member")

    assert (
        _client(outsider).post(f"/api/v1/jobs/{service.pk}/scale/", {"replicas": 2}, format="json").status_code == 404
    )
    assert _client(viewer).post(f"/api/v1/jobs/{service.pk}/load/", {"load": 2.0}, format="json").status_code == 403
    bad = _client(member).post(f"/api/v1/jobs/{service.pk}/scale/", {"replicas": 5}, format="json")
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_replicas"
    response = _client(member).post(f"/api/v1/jobs/{service.pk}/load/", {"load": 2.0}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["replicas"] == 2
