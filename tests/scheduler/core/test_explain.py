"""Step 6: every pending job gets a code, a sentence and its queue positions."""

from __future__ import annotations

from scheduler.core import plan
from scheduler.core.types import PendingReason, Policy

from .builders import alloc, job, node, quota, snapshot


def test_every_pending_job_is_explained_exactly_once_with_positions():
    pending = [
        job("a1", "team-a", cards=4, submitted_at=1),
        job("b1", "team-b", cards=4, submitted_at=2),
        job("a2", "team-a", cards=4, submitted_at=3),
        job("wait", "team-b", awaiting_approval=True, submitted_at=4),
    ]
    busy = [alloc("busy", "n1-gpu0", "team-c")]  # the jobs fit the node, just not now
    result = plan(snapshot([node("n1", 4)], pending=pending, allocations=busy), Policy())
    assert not result.places
    by_id = {e.job_id: e for e in result.explanations}
    assert sorted(by_id) == ["a1", "a2", "b1", "wait"]
    assert [e.position_overall for e in result.explanations] == [1, 2, 3, 4]
    assert (by_id["a1"].position_in_tenant, by_id["a2"].position_in_tenant) == (1, 2)
    assert (by_id["b1"].position_in_tenant, by_id["wait"].position_in_tenant) == (1, 2)
    assert by_id["wait"].code == PendingReason.AWAITING_APPROVAL
    assert "position 3 in the queue, 2 among team-a's jobs" in by_id["a2"].message


def test_quota_explanation_reads_like_the_issue_example():
    s = snapshot(
        [node("n1", 16)],
        allocations=[alloc("running", "n1-gpu0", "team-a")],
        pending=[job("big", "team-a", cards=8)],
        quotas=[quota("team-a", 8, 8)],
    )
    (explain,) = plan(s, Policy()).explanations
    assert explain.code == PendingReason.QUOTA_LIMIT
    assert explain.message.startswith("tenant quota limit for nvidia-h100-80g reached: 1/8 cards in use")


def test_cycle_limit_marks_jobs_not_looked_at():
    pending = [job(f"j{i}", submitted_at=i) for i in range(5)]
    result = plan(snapshot([node("n1", 8)], pending=pending), Policy(max_jobs_per_cycle=3))
    assert len(result.places) == 3
    assert {e.code for e in result.explanations} == {PendingReason.CYCLE_LIMIT}


def test_placed_jobs_are_not_explained():
    result = plan(snapshot([node("n1", 1)], pending=[job("j")]), Policy())
    assert [p.job_id for p in result.places] == ["j"]
    assert result.explanations == ()
