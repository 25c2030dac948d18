"""Start-time estimates on the database: runtime predictions from history, the refresh task, what users see."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.utils import timezone, translation

from scheduler import eta, tasks
from scheduler.core.eta import CALIBRATION_OFFSET_S, Calibration
from scheduler.models import Allocation, Job, JobState
from scheduler.selectors import duration_words, job_pending_sentence, job_start_estimate_sentence
from scheduler.services.cycle import run_cycle
from scheduler.services.jobs import job_submit
from tests.scheduler.factories import JobFactory, TenantFactory, UserFactory
from tests.scheduler.test_api import client_for

SPEC = {"name": "train", "tenant": "team-a", "resources": {"flavors": ["sim-80g"], "gpus": 1}, "command": ["python"]}


@pytest.fixture(autouse=True)
def _fresh_throttle(no_cycle_requests):
    keys = [eta.LAST_REFRESH_KEY, eta.RUNNING_KEY, eta.CALIBRATION_KEY, eta.FIRST_ESTIMATES_KEY]
    cache.delete_many(keys)
    yield
    cache.delete_many(keys)


def finished(user, tenant, *, runtime_s: float, name: str = "train", command=("python",), ago_s: float = 3600):
    """A job of ``user`` that ran ``runtime_s`` and finished ``ago_s`` ago."""
    end = timezone.now() - timedelta(seconds=ago_s)
    return JobFactory(
        tenant=tenant,
        submitter=user,
        name=name,
        command=list(command),
        state=JobState.SUCCEEDED,
        started_at=end - timedelta(seconds=runtime_s),
        finished_at=end,
    )


def job_fields(job: Job) -> eta._Job:
    return eta._jobs([job.pk])[job.pk]


def test_history_predicts_the_users_median_runtime_for_the_same_name(member, tenant):
    for i, runtime in enumerate((100, 200, 300, 400, 5000)):
        finished(member, tenant, runtime_s=runtime, ago_s=100 + i)
    someone_else = UserFactory(username="other")
    for _ in range(5):
        finished(someone_else, tenant, runtime_s=99_999)
    queued = JobFactory(tenant=tenant, submitter=member, name="train")
    prediction = eta.RuntimeHistory.load(now=timezone.now()).predict(job_fields(queued))
    assert prediction.source == "name"
    assert prediction.p50_s == 300
    assert prediction.p10_s <= prediction.p50_s <= prediction.p90_s


def test_history_keeps_only_the_last_n_jobs_of_a_group(member, tenant, settings):
    settings.GPUPOOL_ETA_HISTORY_JOBS = 3
    for runtime in (50, 60, 70):
        finished(member, tenant, runtime_s=runtime, ago_s=100)  # the recent ones
    for _ in range(5):
        finished(member, tenant, runtime_s=10_000, ago_s=7200)  # older
    queued = JobFactory(tenant=tenant, submitter=member, name="train")
    assert eta.RuntimeHistory.load(now=timezone.now()).predict(job_fields(queued)).p50_s == 60


def test_same_command_predicts_when_the_name_is_new(member, tenant):
    for runtime in (1000, 1100, 1200):
        finished(member, tenant, runtime_s=runtime, name=f"sweep-{runtime}", command=("python", "sweep.py"))
    queued = JobFactory(tenant=tenant, submitter=member, name="sweep-new", command=["python", "sweep.py"])
    prediction = eta.RuntimeHistory.load(now=timezone.now()).predict(job_fields(queued))
    assert (prediction.source, prediction.p50_s) == ("command", 1100)


def test_without_history_the_runtime_estimate_then_the_default_is_used(member, tenant, settings):
    settings.GPUPOOL_ETA_DEFAULT_RUNTIME_S = 1800
    history = eta.RuntimeHistory.load(now=timezone.now())
    estimated = JobFactory(tenant=tenant, submitter=member, runtime_estimate_s=900)
    assert history.predict(job_fields(estimated)).p50_s == 900
    plain = JobFactory(tenant=tenant, submitter=member)
    prediction = history.predict(job_fields(plain))
    assert (prediction.source, prediction.p50_s) == ("default", 1800)


def test_max_runtime_caps_every_percentile(member, tenant):
    for runtime in (5000, 6000, 7000):
        finished(member, tenant, runtime_s=runtime)
    queued = JobFactory(tenant=tenant, submitter=member, name="train", max_runtime_s=5500)
    prediction = eta.RuntimeHistory.load(now=timezone.now()).predict(job_fields(queued))
    assert (prediction.p10_s, prediction.p50_s, prediction.p90_s) == (5200, 5500, 5500)


def _busy_pool(member, tenant, *, runtime_s: float = 600):
    """node-a's two cards run two 'train' jobs (history says 'train' takes ``runtime_s``); a third waits."""
    for i in range(3):
        finished(member, tenant, runtime_s=runtime_s, ago_s=100 + i)
    jobs = [job_submit(actor=member, spec=SPEC) for _ in range(3)]
    run_cycle()
    waiting = Job.objects.get(pk=jobs[2].pk)
    assert waiting.state == JobState.QUEUED
    return waiting


def test_the_task_writes_a_start_estimate_and_a_band(member, tenant, node):
    waiting = _busy_pool(member, tenant)
    placed_at = min(a.started_at for a in Allocation.objects.active())
    result = tasks.estimate_starts()
    assert result["ran"] and result["estimated"] == 1
    waiting.refresh_from_db()
    # The two running jobs end 600 s after they were placed; the waiting one starts then.
    assert abs((waiting.estimated_start_at - placed_at).total_seconds() - 600) < 2
    assert waiting.estimated_start_p10_at <= waiting.estimated_start_at <= waiting.estimated_start_p90_at
    assert waiting.estimated_at is not None


def test_a_second_call_within_the_interval_does_nothing(member, tenant, node, settings):
    settings.GPUPOOL_ETA_INTERVAL_S = 300
    waiting = _busy_pool(member, tenant)
    assert eta.job_start_estimates_refresh().ran
    first = Job.objects.get(pk=waiting.pk).estimated_at
    again = eta.job_start_estimates_refresh()
    assert (again.ran, again.reason) == (False, "throttled")
    assert Job.objects.get(pk=waiting.pk).estimated_at == first
    # A big change may refresh sooner than the interval (but not within CHANGE_MIN_GAP_S of the last one).
    cache.set(eta.LAST_REFRESH_KEY, {"at": timezone.now().timestamp() - 10, "took_s": 0.1})
    assert eta.job_start_estimates_refresh(after_change=True).ran
    assert not eta.job_start_estimates_refresh().ran


def test_a_refresh_does_not_run_while_another_worker_computes(member, tenant, node):
    cache.add(eta.RUNNING_KEY, 1, timeout=60)
    assert eta.job_start_estimates_refresh().reason == "running"


def test_a_cycle_that_starts_many_jobs_asks_for_new_estimates(
    member, node, settings, monkeypatch, django_capture_on_commit_callbacks
):
    settings.GPUPOOL_ETA_CHANGE_JOBS = 2
    asked = []
    monkeypatch.setattr(eta, "estimates_refresh_request", lambda: asked.append(1))
    for _ in range(2):
        job_submit(actor=member, spec=SPEC)
    with django_capture_on_commit_callbacks(execute=True):
        run_cycle()
    assert asked == [1]
    job_submit(actor=member, spec=SPEC)  # fits nowhere: the next cycle starts nothing
    with django_capture_on_commit_callbacks(execute=True):
        run_cycle()
    assert asked == [1]


def test_running_past_the_prediction_leaves_a_little_time_not_a_negative_one(member, tenant, node):
    waiting = _busy_pool(member, tenant, runtime_s=600)
    Allocation.objects.active().update(started_at=timezone.now() - timedelta(hours=2))
    tasks.estimate_starts()
    waiting.refresh_from_db()
    wait_s = (waiting.estimated_start_at - waiting.estimated_at).total_seconds()
    assert 0 < wait_s <= eta.OVERDUE_REMAINING_S + 1


def test_api_returns_the_estimate(member, tenant, node):
    waiting = _busy_pool(member, tenant)
    tasks.estimate_starts()
    body = client_for(member).get(f"/api/v1/jobs/{waiting.pk}/").json()
    assert body["estimated_start_at"] and body["estimated_start_p10_at"] and body["estimated_start_p90_at"]
    assert "Expected to start in about 10 min" in body["pending_reason"]
    listed = client_for(member).get("/api/v1/jobs/").json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert {r["id"]: r["estimated_start_at"] for r in rows}[waiting.pk] == body["estimated_start_at"]


def test_the_pending_sentence_says_when_the_job_is_expected_to_start(member, tenant):
    now = timezone.now()
    job = JobFactory(
        tenant=tenant,
        estimated_start_at=now + timedelta(minutes=40),
        estimated_start_p10_at=now + timedelta(minutes=25),
        estimated_start_p90_at=now + timedelta(minutes=70),
    )
    with translation.override("en"):
        assert job_start_estimate_sentence(job, now=now) == (
            "Expected to start in about 40 min (likely between 25 min and 1 h 10 min from now)."
        )
        assert job_pending_sentence(job).endswith("from now).")
    job.state = JobState.RUNNING
    assert job_start_estimate_sentence(job, now=now) == ""


def test_a_job_waiting_past_its_band_gets_a_wider_open_ended_estimate_not_the_same_figure(member, tenant, node):
    waiting = _busy_pool(member, tenant, runtime_s=600)
    eta.estimates_compute()
    waiting.refresh_from_db()
    assert waiting.estimated_start_p90_at is not None
    # The running jobs do not end when predicted (nor are they reclaimed): every new forecast alone says "in
    # 5 minutes" again (OVERDUE_REMAINING_S). The estimate shown must move out instead, with no upper end.
    medians = []
    for minutes in (20, 30, 45):
        now = timezone.now() + timedelta(minutes=minutes)
        eta.estimates_compute(now=now)
        waiting.refresh_from_db()
        assert waiting.estimated_start_p90_at is None
        waited_s = (now - waiting.submitted_at).total_seconds()
        assert (waiting.estimated_start_at - now).total_seconds() >= waited_s - 1
        medians.append(waiting.estimated_start_at)
        with translation.override("en"):
            assert job_start_estimate_sentence(waiting, now=now).endswith("possibly much later.")
    assert medians == sorted(medians) and len(set(medians)) == len(medians)


def test_with_no_finished_job_to_go_by_a_waiting_job_has_no_upper_end(member, tenant, node):
    jobs = [job_submit(actor=member, spec=SPEC) for _ in range(3)]
    run_cycle()
    eta.estimates_compute()
    waiting = Job.objects.get(pk=jobs[2].pk)
    assert waiting.state == JobState.QUEUED and waiting.estimated_start_at is not None
    assert waiting.estimated_start_p90_at is None  # a runtime nobody measured: no band around the guess


def test_a_started_jobs_error_joins_the_calibration_and_calibrated_bands_follow_it(member, tenant, node):
    waiting = _busy_pool(member, tenant, runtime_s=600)
    eta.estimates_compute()
    made_at, forecast_wait_s, _keys = cache.get(eta.FIRST_ESTIMATES_KEY)[str(waiting.pk)]
    # It started half an hour after that estimate (whatever the forecast said); the next refresh learns it.
    Job.objects.filter(pk=waiting.pk).update(
        state=JobState.RUNNING,
        started_at=timezone.now() + timedelta(seconds=1800 - (timezone.now().timestamp() - made_at)),
    )
    eta.estimates_compute()
    errors = cache.get(eta.CALIBRATION_KEY)[""]  # the class of all jobs
    expected = math.log((1800 + CALIBRATION_OFFSET_S) / (forecast_wait_s + CALIBRATION_OFFSET_S))
    assert errors == [pytest.approx(expected, abs=0.01)]
    assert str(waiting.pk) not in cache.get(eta.FIRST_ESTIMATES_KEY)
    # A past in which every start came three times (in wait + one cycle) later than forecast.
    calibration = Calibration()
    for _ in range(eta.CALIBRATION_MIN_ERRORS):
        calibration.add([()], 600, 3 * (600 + CALIBRATION_OFFSET_S) - CALIBRATION_OFFSET_S)
    cache.set(eta.CALIBRATION_KEY, calibration.as_dict())
    queued = job_submit(actor=member, spec=SPEC)
    eta.estimates_compute()
    queued.refresh_from_db()
    forecast_s = cache.get(eta.FIRST_ESTIMATES_KEY)[str(queued.pk)][1]
    # The median stays the forecast's; the band moves out to where the past's starts came.
    wait_s = (queued.estimated_start_at - queued.estimated_at).total_seconds()
    assert wait_s == pytest.approx(forecast_s, abs=1)
    p90_wait_s = (queued.estimated_start_p90_at - queued.estimated_at).total_seconds()
    assert p90_wait_s == pytest.approx(3 * (forecast_s + CALIBRATION_OFFSET_S) - CALIBRATION_OFFSET_S, abs=1)
    assert queued.estimated_start_p10_at <= queued.estimated_start_at <= queued.estimated_start_p90_at


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(90, "2 min"), (40 * 60, "40 min"), (80 * 60, "1 h 20 min"), (14 * 3600, "14 h"), (3 * 86400, "3 days")],
)
def test_waits_are_said_the_way_a_person_says_them(seconds, words):
    with translation.override("en"):
        assert duration_words(seconds) == words


def test_console_shows_the_expected_start_on_the_job_page_and_the_list(client, member, tenant, node):
    waiting = _busy_pool(member, tenant)
    tasks.estimate_starts()
    client.force_login(member)
    page = client.get(f"/console/jobs/{waiting.pk}/").content.decode()
    assert "Expected to start in about 10 min" in page
    assert 'data-testid="expected-start"' in page
    listing = client.get("/console/jobs/").content.decode()
    assert "in about 10 min" in listing
    client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/console/jobs/"})
    assert "预计约 10 分钟后开始" in client.get(f"/console/jobs/{waiting.pk}/").content.decode()
    assert "约 10 分钟后" in client.get("/console/jobs/").content.decode()


def test_a_refresh_out_of_time_writes_what_it_has_and_no_estimate_for_the_rest(member, tenant, node, settings):
    settings.GPUPOOL_ETA_MAX_SECONDS = 0
    waiting = _busy_pool(member, tenant)
    assert tasks.estimate_starts()["ran"]
    waiting.refresh_from_db()
    assert waiting.estimated_at is not None and waiting.estimated_start_at is None


def test_a_failed_refresh_is_not_retried_back_to_back(member, tenant, node, monkeypatch):
    def broken(**_kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(eta, "estimates_compute", broken)
    with pytest.raises(RuntimeError):
        eta.job_start_estimates_refresh()
    assert eta.job_start_estimates_refresh().reason == "throttled"
    assert cache.get(eta.RUNNING_KEY) is None


def test_a_running_job_predicted_from_the_pool_has_what_the_pools_longer_jobs_had_left(member, tenant, node):
    """Without runs of its own, a job that has outrun the pool's median is one of the long ones: the forecast
    without history called it nearly done and was consistently early (benchmarks/eta_accuracy.py)."""
    elsewhere = TenantFactory(slug="team-b")
    stranger = UserFactory(username="stranger")
    for i, runtime in enumerate((600, 600, 600, 7200, 7200)):
        finished(stranger, elsewhere, runtime_s=runtime, name=f"other-{i}", command=("other",), ago_s=100 + i)
    spec = {**SPEC, "name": "first-of-its-kind", "command": ["new.py"]}
    jobs = [job_submit(actor=member, spec=spec) for _ in range(3)]
    run_cycle()
    waiting = Job.objects.get(pk=jobs[2].pk)
    assert waiting.state == JobState.QUEUED
    assert eta.RuntimeHistory.load(now=timezone.now()).predict(job_fields(waiting)).source == "pool"
    Allocation.objects.active().update(started_at=timezone.now() - timedelta(hours=1))
    Job.objects.filter(pk__in=[jobs[0].pk, jobs[1].pk]).update(started_at=timezone.now() - timedelta(hours=1))
    tasks.estimate_starts()
    waiting.refresh_from_db()
    wait_s = (waiting.estimated_start_at - waiting.estimated_at).total_seconds()
    # The pool's jobs that ran past an hour ran 2 h: an hour left, not the 5 min "overdue" of a 10-min median.
    assert wait_s == pytest.approx(3600, abs=60)
