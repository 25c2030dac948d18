"""Step 3, inference reservations: training may borrow them; the service takes them back when it scales up."""

from __future__ import annotations

from scheduler.core import plan
from scheduler.core.types import JobKind, PendingReason, Policy, PreemptReason, Reservation

from .builders import FLAVOR, MEM, alloc, job, node, snapshot

NOW = 10_000.0


def _reservation(device: str, service: str = "svc") -> Reservation:
    return Reservation(service, "team-inf", device.rsplit("-gpu", 1)[0], device, FLAVOR, 1000, MEM)


def test_reserved_capacity_is_not_used_by_ordinary_jobs():
    s = snapshot(
        [node("n1", 1)],
        reservations=(_reservation("n1-gpu0"),),
        pending=[job("interactive", kind=JobKind.INTERACTIVE)],
    )
    result = plan(s, Policy())
    assert not result.places


def test_preemptible_training_runs_on_an_idle_reservation():
    s = snapshot(
        [node("n1", 1)], reservations=(_reservation("n1-gpu0"),), pending=[job("train", kind=JobKind.TRAINING)]
    )
    (place,) = plan(s, Policy()).places
    assert place.assignments[0].reservation_of == "svc"
    assert place.assignments[0].device_uuid == "n1-gpu0"


def test_training_at_the_churn_ceiling_may_not_borrow_a_reservation_the_service_could_not_take_back():
    def places(preemptions: int, ceiling: int | None = 3) -> int:
        train = job("train", kind=JobKind.TRAINING, preemptions=preemptions, last_preempted_at=0.0)
        s = snapshot([node("n1", 1)], reservations=(_reservation("n1-gpu0"),), pending=[train], now=NOW)
        return len(plan(s, Policy(max_preemptions_per_job=ceiling)).places)

    assert places(2) == 1
    assert places(3) == 0
    assert places(3, ceiling=None) == 1


def test_non_preemptible_training_may_not_borrow_a_reservation():
    s = snapshot([node("n1", 1)], reservations=(_reservation("n1-gpu0"),), pending=[job("train", preemptible=False)])
    assert not plan(s, Policy()).places


def test_service_scaling_up_reclaims_its_reservation_from_training_at_once():
    s = snapshot(
        [node("n1", 1)],
        reservations=(_reservation("n1-gpu0"),),
        allocations=[alloc("train", "n1-gpu0", reservation_of="svc", started_at=NOW - 5)],
        pending=[job("svc", "team-inf", kind=JobKind.INFERENCE, first_replica=1)],
        now=NOW,
    )
    result = plan(s, Policy(min_runtime_before_preempt_s=600))
    (pre,) = result.preemptions
    assert (pre.job_id, pre.victim_of, pre.reason) == ("train", "svc", PreemptReason.RESERVATION_RECLAIM)
    explain = next(e for e in result.explanations if e.job_id == "svc")
    assert explain.code == PendingReason.WAITING_FOR_PREEMPTION


def test_service_scaling_up_uses_its_idle_reservation_directly():
    s = snapshot(
        [node("n1", 2)],
        reservations=(_reservation("n1-gpu1"),),
        pending=[job("svc", "team-inf", kind=JobKind.INFERENCE, first_replica=3)],
    )
    (place,) = plan(s, Policy()).places
    assert place.assignments[0].device_uuid == "n1-gpu1"
    assert place.assignments[0].reservation_of == "svc"
    assert place.assignments[0].replica == 3
