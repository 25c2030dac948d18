"""Start-time estimates: the forward simulation of ``scheduler.core.eta`` steps the real engine."""

from __future__ import annotations

import math

from scheduler.core.eta import Limits, Runtimes, StopReason, estimate_starts, forecast
from scheduler.core.types import Hold, Policy

from .builders import alloc, job, node, snapshot

NOW = 10_000.0
# One-second steps: the tiny cases below check exact times, not the coarse steps a big queue needs.
EXACT = Limits(min_step_s=1.0, relative_step=0.0)


def _full_node(job_id: str = "running", *, started_at: float = NOW - 100, **kw) -> list:
    return [alloc(job_id, f"n1-gpu{i}", started_at=started_at, **kw) for i in range(8)]


def test_pending_job_starts_when_the_running_job_ends():
    snap = snapshot([node("n1", 8)], allocations=_full_node(), pending=[job("wait", cards=8)], now=NOW)
    result = forecast(snap, Policy(), Runtimes(remaining_s={"running": 600}), EXACT)
    assert result.starts == {"wait": NOW + 600}
    assert result.stopped == StopReason.DONE


def test_a_job_that_fits_now_starts_now():
    snap = snapshot([node("n1", 8)], pending=[job("now", cards=2)], now=NOW)
    assert forecast(snap, Policy(), Runtimes()).starts == {"now": NOW}


def test_queue_is_served_in_the_engines_order_after_each_end():
    # first (8 cards) waits for the running job; second waits for first to finish its 1,200 s.
    pending = [job("first", cards=8, submitted_at=1), job("second", cards=8, submitted_at=2)]
    snap = snapshot([node("n1", 8)], allocations=_full_node(), pending=pending, now=NOW)
    runtimes = Runtimes(remaining_s={"running": 600}, runtime_s={"first": 1200, "second": 60})
    assert forecast(snap, Policy(), runtimes, EXACT).starts == {"first": NOW + 600, "second": NOW + 1800}


def test_a_higher_priority_job_submitted_later_goes_first():
    pending = [job("low", cards=8, priority=200, submitted_at=1), job("high", cards=8, priority=800, submitted_at=2)]
    # Not preemptible: the high job must wait for the end, not preempt.
    snap = snapshot([node("n1", 8)], allocations=_full_node(preemptible=False), pending=pending, now=NOW)
    runtimes = Runtimes(remaining_s={"running": 600}, runtime_s={"high": 300, "low": 300})
    assert forecast(snap, Policy(), runtimes, EXACT).starts == {"high": NOW + 600, "low": NOW + 900}


def test_preemption_is_accounted_the_preemptor_starts_after_the_grace_period():
    # A preemptible low-priority job holds the node for hours; a critical job preempts it and starts after the
    # grace period; the victim goes back to the queue and starts again when the critical one ends.
    running = _full_node(priority=200, started_at=NOW - 3600)
    pending = [job("critical", cards=8, priority=1000, preempted_by=frozenset())]
    snap = snapshot([node("n1", 8)], allocations=running, pending=pending, now=NOW)
    policy = Policy(grace_period_s=60.0)
    result = forecast(snap, policy, Runtimes(remaining_s={"running": 36_000}, runtime_s={"critical": 600}), EXACT)
    assert result.starts["critical"] == NOW + 60
    # The victim restarts (it counts as a start in the forecast) once the critical job is done.
    assert result.starts["running"] == NOW + 660


def test_a_hold_from_the_live_cycle_is_honoured_victims_stop_at_the_end_of_their_grace():
    running = _full_node("victim", priority=200, preemptible=False)  # stopping victims are marked so
    hold = [Hold(job_id="preemptor", device_uuid=f"n1-gpu{i}", victims=("victim",), since=NOW - 20) for i in range(8)]
    pending = [job("preemptor", cards=8, priority=1000), job("other", cards=8, priority=500)]
    snap = snapshot([node("n1", 8)], allocations=running, pending=pending, now=NOW, holds=tuple(hold))
    runtimes = Runtimes(remaining_s={"victim": 36_000}, runtime_s={"preemptor": 100, "other": 100})
    result = forecast(snap, Policy(grace_period_s=60.0), runtimes, EXACT)
    assert result.starts["preemptor"] == NOW + 40  # since + grace
    assert result.starts["other"] == NOW + 140


def test_jobs_that_can_never_start_get_no_estimate():
    pending = [job("approval", cards=1, awaiting_approval=True), job("nosuch", cards=1, flavor="no-such-flavor")]
    snap = snapshot([node("n1", 8)], pending=pending, now=NOW)
    result = forecast(snap, Policy(), Runtimes())
    assert result.starts == {}
    assert result.never == {"approval", "nosuch"}


def test_a_service_that_never_ends_keeps_its_cards():
    snap = snapshot([node("n1", 8)], allocations=_full_node("svc"), pending=[job("wait", cards=1)], now=NOW)
    result = forecast(snap, Policy(), Runtimes(remaining_s={"svc": math.inf}))
    assert result.starts == {}
    assert result.stopped == StopReason.NO_EVENTS


def test_the_horizon_and_the_cycle_cap_bound_the_work():
    snap = snapshot([node("n1", 8)], allocations=_full_node(), pending=[job("wait", cards=8)], now=NOW)
    late = Runtimes(remaining_s={"running": 10 * 86400})
    assert forecast(snap, Policy(), late, Limits(horizon_s=86400)).stopped == StopReason.HORIZON
    many = [job(f"j{i}", cards=8, submitted_at=i) for i in range(20)]
    snap = snapshot([node("n1", 8)], allocations=_full_node(), pending=many, now=NOW)
    result = forecast(snap, Policy(), Runtimes(remaining_s={"running": 60}, default_s=60), Limits(max_cycles=5))
    assert result.cycles == 5 and result.stopped == StopReason.MAX_CYCLES
    assert len(result.starts) == 4  # the cycle at NOW starts none; each of the next four starts one


def test_until_started_stops_once_the_asked_for_job_has_started():
    many = [job(f"j{i}", cards=8, submitted_at=i) for i in range(10)]
    snap = snapshot([node("n1", 8)], allocations=_full_node(), pending=many, now=NOW)
    runtimes = Runtimes(remaining_s={"running": 60}, default_s=60)
    result = forecast(snap, Policy(), runtimes, EXACT, until_started={"j1"})
    assert set(result.starts) == {"j0", "j1"} and result.starts["j1"] == NOW + 120


def test_coarse_steps_give_starts_at_most_one_step_late():
    pending = [job("first", cards=8, submitted_at=1), job("second", cards=8, submitted_at=2)]
    snap = snapshot([node("n1", 8)], allocations=_full_node(), pending=pending, now=NOW)
    runtimes = Runtimes(remaining_s={"running": 30}, runtime_s={"first": 30})
    result = forecast(snap, Policy(), runtimes, Limits(min_step_s=100.0))
    # The end at +30 is seen by the cycle at +100 and the start is dated at the end that freed the cards.
    assert result.starts["first"] == NOW + 30
    assert NOW + 60 <= result.starts["second"] <= NOW + 60 + 100


def test_band_is_ordered_and_follows_the_runtimes():
    snap = snapshot([node("n1", 8)], allocations=_full_node(), pending=[job("wait", cards=8)], now=NOW)
    bands = estimate_starts(
        snap,
        Policy(),
        short=Runtimes(remaining_s={"running": 300}),
        median=Runtimes(remaining_s={"running": 600}),
        long=Runtimes(remaining_s={"running": 1800}),
        limits=EXACT,
    )
    band = bands["wait"]
    assert (band.p10_at, band.p50_at, band.p90_at) == (NOW + 300, NOW + 600, NOW + 1800)


def test_band_without_a_median_start_is_empty():
    snap = snapshot([node("n1", 8)], allocations=_full_node(), pending=[job("wait", cards=8)], now=NOW)
    bands = estimate_starts(
        snap,
        Policy(),
        short=Runtimes(remaining_s={"running": 300}),
        median=Runtimes(remaining_s={"running": 30 * 86400}),
        long=Runtimes(remaining_s={"running": 30 * 86400}),
    )
    assert bands["wait"].p50_at is None and bands["wait"].p10_at is None


def test_forecast_is_deterministic():
    pending = [job(f"j{i}", cards=1 + i % 4, submitted_at=i, tenant=f"t{i % 3}") for i in range(30)]
    snap = snapshot([node("n1", 8), node("n2", 8)], allocations=_full_node(), pending=pending, now=NOW)
    runtimes = Runtimes(remaining_s={"running": 500}, runtime_s={f"j{i}": 100.0 * (i % 7 + 1) for i in range(30)})
    assert forecast(snap, Policy(), runtimes) == forecast(snap, Policy(), runtimes)


def test_out_of_time_stops_the_forecast_after_the_cycle_that_asked():
    many = [job(f"j{i}", cards=8, submitted_at=i) for i in range(10)]
    snap = snapshot([node("n1", 8)], allocations=_full_node(), pending=many, now=NOW)
    asked = []
    result = forecast(
        snap,
        Policy(),
        Runtimes(remaining_s={"running": 60}, default_s=60),
        EXACT,
        out_of_time=lambda: len(asked) >= 2 or asked.append(1),
    )
    assert result.stopped == StopReason.OUT_OF_TIME
    assert result.cycles == 3 and set(result.starts) == {"j0", "j1"}
