"""``Place.allocations``: the running rows a placement becomes, for callers that step the engine forward (the
start-time forecast and the simulator build them the same way)."""

from __future__ import annotations

from scheduler.core import plan
from scheduler.core.types import Assignment, JobKind, Place, Policy

from .builders import FLAVOR, job, node, quota, snapshot


def test_borrowed_millis_go_onto_the_first_assignments_in_order():
    place = Place(
        "j1",
        "team-a",
        FLAVOR,
        (
            Assignment(0, "n1", "n1-gpu0", 1000, 80, cpu_millicores=4000, host_memory_mib=1024),
            Assignment(0, "n1", "n1-gpu1", 1000, 80),
            Assignment(1, "n1", "n1-gpu2", 1000, 80, reservation_of="svc"),
        ),
        borrowed_millis=1500,
    )
    rows = place.allocations(
        priority=800,
        preemptible=True,
        started_at=10.0,
        last_checkpoint_at=12.0,
        expected_end_at=99.0,
        kind=JobKind.BATCH,
        preemptions=2,
    )
    assert [r.borrowed_millis for r in rows] == [1000, 500, 0]
    assert [(r.replica, r.device_uuid, r.reservation_of) for r in rows] == [
        (0, "n1-gpu0", None),
        (0, "n1-gpu1", None),
        (1, "n1-gpu2", "svc"),
    ]
    first = rows[0]
    assert (first.job_id, first.tenant, first.flavor, first.priority, first.preemptible) == (
        "j1",
        "team-a",
        FLAVOR,
        800,
        True,
    )
    assert (first.started_at, first.last_checkpoint_at, first.expected_end_at) == (10.0, 12.0, 99.0)
    assert (first.kind, first.preemptions, first.cpu_millicores, first.host_memory_mib) == (
        JobKind.BATCH,
        2,
        4000,
        1024,
    )
    assert rows[1].cpu_millicores == 0


def test_rows_of_a_plan_fed_back_leave_no_room_for_a_second_copy():
    """What a placement becomes, in the next snapshot, holds its devices: the same job does not fit again."""
    s = snapshot([node("n1", 2)], pending=[job("j1", cards=2)], quotas=[quota("team-a", 2)])
    (place,) = plan(s, Policy()).places
    rows = place.allocations(
        priority=500, preemptible=False, started_at=s.now, last_checkpoint_at=None, expected_end_at=None
    )
    again = plan(snapshot([node("n1", 2)], pending=[job("j2", cards=1)], allocations=rows, quotas=[quota("team-a", 3)]))
    assert again.places == ()
    assert sum(r.millis for r in rows) == 2000 and {r.job_id for r in rows} == {"j1"}
