"""Start-time bands that hold what they say: calibrated on past errors, widened once a job outwaits its band,
"unknown" without a basis (``scheduler.core.eta.Calibration``, ``age_aware``)."""

from __future__ import annotations

import math
import random

import pytest

from scheduler.core.eta import (
    Calibration,
    Limits,
    Runtimes,
    StartBand,
    age_aware,
    bands_from,
    forecast,
    size_class,
    wait_class,
)
from scheduler.core.types import Policy

from .builders import alloc, job, node, snapshot

NOW = 10_000.0
EXACT = Limits(min_step_s=1.0, relative_step=0.0)
KEYS = [("short", "team-a", "1"), ("short", "1"), ("short",), ()]


def _history(rng: random.Random, n: int) -> list[tuple[float, float]]:
    """(forecast wait, actual wait) pairs like a real queue's: the forecast is early (jobs ahead run longer than
    predicted, later arrivals go first) by a factor spread over a wide, skewed range."""
    pairs = []
    for _ in range(n):
        forecast_s = rng.uniform(120, 1700)
        pairs.append((forecast_s, forecast_s * math.exp(rng.gauss(0.6, 0.9)) + rng.expovariate(1 / 120)))
    return pairs


def _inside(band: StartBand, start: float) -> bool:
    assert band.p10_at is not None and band.p90_at is not None
    return band.p10_at <= start <= band.p90_at


def test_without_past_errors_the_band_is_unknown():
    calibration = Calibration(min_samples=30)
    assert calibration.band(KEYS, now=NOW, forecast_wait_s=600) is None
    calibration.add(KEYS, 600, 900)
    assert calibration.band(KEYS, now=NOW, forecast_wait_s=600) is None  # one error is no basis either


def test_calibrated_band_holds_80_percent_of_held_out_starts_where_the_raw_band_does_not():
    rng = random.Random(33)
    calibration = Calibration(min_samples=30)
    for forecast_s, actual_s in _history(rng, 600):  # the part calibrated on
        calibration.add(KEYS, forecast_s, actual_s)
    held_out = _history(rng, 1000)
    calibrated = raw = 0
    for forecast_s, actual_s in held_out:
        band = calibration.band(KEYS, now=NOW, forecast_wait_s=forecast_s)
        assert band is not None and band.p10_at <= band.p50_at <= band.p90_at
        calibrated += _inside(band, NOW + actual_s)
        # The uncalibrated band: "what if jobs run half / twice as long" around the forecast.
        raw += _inside(StartBand(NOW + forecast_s / 2, NOW + forecast_s, NOW + 2 * forecast_s), NOW + actual_s)
    assert raw / len(held_out) < 0.8
    assert 0.8 <= calibrated / len(held_out) <= 0.9  # what it promises, and not a band too wide to mean anything


def test_a_forecast_that_is_always_early_keeps_its_median_and_gets_a_band_that_holds_the_starts():
    # The median is not scaled: scaled by the errors of the days before it moved hours off on the Philly trace
    # (benchmarks/eta_accuracy.py); the band is where the past's errors say the start will be.
    calibration = Calibration(min_samples=30)
    for i in range(100):
        calibration.add(KEYS, 600, 3 * (600 + 60) - 60 + i)  # three times the forecast (in wait + one cycle)
    band = calibration.band(KEYS, now=NOW, forecast_wait_s=600)
    assert band is not None
    assert band.p50_at - NOW == 600
    assert band.p10_at == band.p50_at  # every past start came later than forecast
    assert band.p90_at - NOW > 2.5 * 600


def test_each_class_is_calibrated_apart_and_a_small_class_falls_back_to_a_coarser_one():
    calibration = Calibration(min_samples=30)
    exact = [("now", "team-a", "1"), ("now", "1"), ("now",), ()]
    for i in range(40):
        calibration.add(exact, 0, 0)  # jobs that fit now start now
        calibration.add(KEYS, 600, 600 * (1 + i / 10))  # waits are far less certain
    now_band = calibration.band(exact, now=NOW, forecast_wait_s=0)
    wait_band = calibration.band(KEYS, now=NOW, forecast_wait_s=600)
    assert now_band == StartBand(NOW, NOW, NOW)
    assert wait_band is not None and wait_band.p90_at - wait_band.p10_at > 1800
    # team-b's own class has no errors: its estimate comes from (short, size), the class team-a filled.
    team_b = [("short", "team-b", "1"), ("short", "1"), ("short",), ()]
    assert calibration.samples(team_b) == (("short", "1"), 40)
    assert calibration.band(team_b, now=NOW, forecast_wait_s=600) == wait_band


def test_calibration_survives_a_round_trip_through_json_shapes():
    calibration = Calibration(min_samples=3, max_samples=5)
    for i in range(8):
        calibration.add(KEYS, 60, 60 + i)
    assert all(len(errors) == 5 for errors in calibration.errors.values())  # only the latest are kept
    again = Calibration.from_dict(calibration.as_dict(), min_samples=3)
    assert again.band(KEYS, now=NOW, forecast_wait_s=60) == calibration.band(KEYS, now=NOW, forecast_wait_s=60)


def test_classes():
    assert [wait_class(s) for s in (0, 59, 600, 7200, 20_000)] == ["now", "now", "short", "long", "longer"]
    assert [size_class(d) for d in (0.5, 1, 3, 8, 16)] == ["part", "1", "2-4", "5-8", "9+"]


def _reclaim_that_does_not_happen(now: float):
    """A critical job waits on a low-priority job the engine should preempt; the forecast says it starts after
    the grace period. Live, the preemption does not happen (nothing changes), so each new forecast says the
    same "in a minute" again."""
    running = [alloc("low", f"n1-gpu{i}", priority=200, started_at=NOW - 3600) for i in range(8)]
    snap = snapshot([node("n1", 8)], allocations=running, pending=[job("critical", cards=8, priority=1000)], now=now)
    runtimes = Runtimes(remaining_s={"low": 36_000}, runtime_s={"critical": 600})
    starts = forecast(snap, Policy(grace_period_s=60.0), runtimes, EXACT).starts
    return bands_from(snap, starts, starts, starts)["critical"]


def test_a_job_waiting_on_a_reclaim_that_does_not_happen_gets_a_wider_band_not_the_same_figure():
    submitted = NOW
    shown = _reclaim_that_does_not_happen(NOW)
    assert shown.p50_at == NOW + 60
    looks = []
    for minutes in (5, 10, 20, 40):
        now = NOW + 60 * minutes
        fresh = _reclaim_that_does_not_happen(now)
        assert fresh.p50_at == now + 60  # the forecast alone repeats its figure
        shown = age_aware(fresh, shown, now=now, submitted_at=submitted)
        looks.append(shown)
        assert shown.p90_at is None  # "possibly much later": the upper end is unknown now
        assert shown.p50_at >= now + (now - submitted)  # it has waited this long: at least as long again
        assert shown.p10_at >= now
    medians = [band.p50_at for band in looks]
    assert medians == sorted(medians) and len(set(medians)) == len(medians)  # it keeps moving out


def test_a_widened_band_is_not_pulled_back_by_the_forecast_that_failed_but_a_later_forecast_wins():
    widened = age_aware(
        StartBand(NOW + 60, NOW + 60, NOW + 120), StartBand(NOW - 600, NOW - 300, NOW - 100), now=NOW, submitted_at=0
    )
    assert widened.p50_at == NOW + NOW and widened.p90_at is None
    # 30 s later the forecast says "in a minute" again: the widened median stands (and moves out with the wait).
    again = age_aware(StartBand(NOW + 90, NOW + 90, NOW + 150), widened, now=NOW + 30, submitted_at=0)
    assert again.p50_at >= widened.p50_at and again.p90_at is None
    # Something changed and the forecast is now later than the widened median: the new forecast is shown.
    later = StartBand(NOW + 2 * NOW, NOW + 3 * NOW, NOW + 4 * NOW)
    assert age_aware(later, widened, now=NOW + 60, submitted_at=0) == later


def test_a_job_inside_its_band_keeps_the_fresh_estimate():
    fresh = StartBand(NOW + 60, NOW + 300, NOW + 900)
    assert age_aware(fresh, StartBand(NOW - 60, NOW + 200, NOW + 600), now=NOW, submitted_at=NOW - 300) == fresh
    assert age_aware(fresh, None, now=NOW, submitted_at=NOW) == fresh


def test_a_running_job_without_history_has_what_the_pools_longer_runs_had_left():
    from scheduler.core.eta import residual_left

    pool = (60.0, 600.0, 600.0, 3600.0, 7200.0)
    assert residual_left(pool, 0, 0.5, overdue_s=300) == 600  # not started: the pool's median
    assert residual_left(pool, 1000, 0.5, overdue_s=300) == pytest.approx(5400 - 1000)  # one of the long ones
    assert residual_left(pool, 9000, 0.5, overdue_s=300) == 300  # longer than any: a little more
    assert residual_left(pool, 1000, 0.5, overdue_s=300, max_runtime_s=1500) == 500  # stopped at its limit
