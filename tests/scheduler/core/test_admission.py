"""Step 2: admission against the quota tree — guarantee, borrowing, lending limits, limits, hierarchy."""

from __future__ import annotations

from scheduler.core import plan
from scheduler.core.types import PendingReason, Policy

from .builders import alloc, job, node, quota, snapshot


def _explained(result, job_id):
    return next(e for e in result.explanations if e.job_id == job_id)


def test_job_within_guarantee_is_admitted_without_borrowing():
    s = snapshot([node("n1", 8)], pending=[job("j", "team-a", cards=4)], quotas=[quota("team-a", 4)])
    (place,) = plan(s, Policy()).places
    assert place.borrowed_millis == 0


def test_tenant_without_quota_is_refused_with_no_quota():
    s = snapshot([node("n1", 8)], pending=[job("j", "team-x")], quotas=[quota("team-a", 4)])
    result = plan(s, Policy())
    assert not result.places
    assert _explained(result, "j").code == PendingReason.NO_QUOTA


def test_without_require_quota_an_unknown_tenant_may_use_unpromised_capacity():
    s = snapshot([node("n1", 8)], pending=[job("j", "team-x", cards=2)], quotas=[quota("team-a", 4)])
    (place,) = plan(s, Policy(require_quota=False)).places
    assert place.borrowed_millis == 2000


def test_borrowing_from_an_idle_sibling_is_marked_borrowed():
    s = snapshot(
        [node("n1", 8)],
        pending=[job("j", "team-a", cards=6)],
        quotas=[quota("team-a", 4, 8), quota("team-b", 4)],
    )
    (place,) = plan(s, Policy()).places
    assert place.borrowed_millis == 2000


def test_exhausted_guarantee_with_borrowing_off_explains_cards_in_use():
    s = snapshot(
        [node("n1", 16)],
        allocations=[alloc(f"r{i}", f"n1-gpu{i}", "team-a") for i in range(8)],
        pending=[job("j", "team-a")],
        quotas=[quota("team-a", 8, 16), quota("team-b", 8)],
    )
    result = plan(s, Policy(borrowing=False))
    explain = _explained(result, "j")
    assert explain.code == PendingReason.QUOTA_EXHAUSTED
    assert "tenant quota for nvidia-h100-80g exhausted: 8/8 cards in use" in explain.message


def test_non_preemptible_job_may_not_borrow():
    # Within the guarantee (4) by itself, but 2 of it are in use: the job would borrow 2. (A job larger than the
    # guarantee can never start without borrowing: ``never_fits``, tests/scheduler/core/test_feasibility.py.)
    s = snapshot(
        [node("n1", 8)],
        allocations=[alloc(f"r{i}", f"n1-gpu{i}", "team-a") for i in range(2)],
        pending=[job("j", "team-a", cards=4, preemptible=False)],
        quotas=[quota("team-a", 4, 8), quota("team-b", 4)],
    )
    result = plan(s, Policy())
    assert not result.places
    assert _explained(result, "j").code == PendingReason.QUOTA_EXHAUSTED


def test_limit_caps_borrowing():
    s = snapshot(
        [node("n1", 8)],
        allocations=[alloc(f"r{i}", f"n1-gpu{i}", "team-a") for i in range(2)],
        pending=[job("j", "team-a", cards=4)],
        quotas=[quota("team-a", 4, 5), quota("team-b", 4)],
    )
    result = plan(s, Policy())
    assert not result.places
    explain = _explained(result, "j")
    assert explain.code == PendingReason.QUOTA_LIMIT
    assert "2/5 cards in use, this job needs 4" in explain.message


def test_lending_limit_bounds_what_siblings_may_borrow():
    s = snapshot(
        [node("n1", 8)],
        pending=[job("j", "team-a", cards=7)],
        quotas=[quota("team-a", 4, 8), quota("team-b", 4, lending_limit_millis=2000)],
    )
    result = plan(s, Policy())
    assert not result.places
    assert _explained(result, "j").code == PendingReason.NO_LENDABLE_CAPACITY
    s6 = snapshot(
        [node("n1", 8)],
        pending=[job("j", "team-a", cards=6)],
        quotas=[quota("team-a", 4, 8), quota("team-b", 4, lending_limit_millis=2000)],
    )
    assert [p.job_id for p in plan(s6, Policy()).places] == ["j"]


def test_busy_sibling_has_nothing_to_lend():
    s = snapshot(
        [node("n1", 8)],
        allocations=[alloc(f"b{i}", f"n1-gpu{i}", "team-b") for i in range(4)],
        pending=[job("j", "team-a", cards=5)],
        quotas=[quota("team-a", 4, 8), quota("team-b", 4)],
    )
    result = plan(s, Policy())
    assert _explained(result, "j").code == PendingReason.NO_LENDABLE_CAPACITY


def test_parent_limit_applies_to_the_whole_subtree():
    tenants = [("dept", None), ("team-a", "dept"), ("team-b", "dept")]
    s = snapshot(
        [node("n1", 8)],
        allocations=[alloc("b0", "n1-gpu0", "team-b"), alloc("b1", "n1-gpu1", "team-b")],
        pending=[job("j", "team-a", cards=2)],
        tenants=tenants,
        quotas=[quota("dept", 4, 3), quota("team-a", 2), quota("team-b", 2)],
    )
    result = plan(s, Policy())
    explain = _explained(result, "j")
    assert explain.code == PendingReason.QUOTA_LIMIT
    assert "parent tenant dept" in explain.message


def test_team_without_own_row_spends_its_departments_quota():
    s = snapshot(
        [node("n1", 8)],
        pending=[job("j1", "team-a", cards=2), job("j2", "team-a", cards=2, submitted_at=1)],
        tenants=[("dept", None), ("team-a", "dept")],
        quotas=[quota("dept", 3, 3)],
    )
    result = plan(s, Policy())
    assert [p.job_id for p in result.places] == ["j1"]
    assert _explained(result, "j2").code == PendingReason.QUOTA_LIMIT


def test_max_running_jobs_is_enforced():
    s = snapshot(
        [node("n1", 8)],
        allocations=[alloc("r0", "n1-gpu0", "team-a")],
        pending=[job("j", "team-a")],
        quotas=[quota("team-a", 8, max_running_jobs=1)],
    )
    result = plan(s, Policy())
    assert _explained(result, "j").code == PendingReason.MAX_RUNNING_JOBS


def test_jobs_admitted_in_one_cycle_count_against_the_limit():
    s = snapshot(
        [node("n1", 8)],
        pending=[job(f"j{i}", "team-a", cards=2, submitted_at=i) for i in range(4)],
        quotas=[quota("team-a", 4, 4)],
    )
    assert [p.job_id for p in plan(s, Policy()).places] == ["j0", "j1"]


def test_second_flavor_is_tried_when_the_first_has_no_quota():
    nodes = [node("h", 2), node("a", 2, flavor="ascend-910b", memory_mib=65536)]
    s = snapshot(
        nodes,
        pending=[job("j", "team-a", flavor=("nvidia-h100-80g", "ascend-910b"))],
        quotas=[quota("team-a", 1, flavor="ascend-910b")],
    )
    (place,) = plan(s, Policy()).places
    assert place.flavor == "ascend-910b"


def test_quota_refusal_is_explained_rather_than_a_missing_second_flavor():
    s = snapshot(
        [node("n1", 2)],
        pending=[job("j", "team-a", cards=2, flavor=("ascend-910b", "nvidia-h100-80g"))],
        quotas=[quota("team-a", 1, 1)],
    )
    (explain,) = plan(s, Policy()).explanations
    assert explain.code == PendingReason.QUOTA_LIMIT
