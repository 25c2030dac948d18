"""The Python SDK: a retried submit creates one job (live server), retries and backoff, pagination, timeouts."""

from __future__ import annotations

import httpx
import pytest

from gpupool_client import Client, NetworkError, RefusedError, ServerError
from gpupool_client.errors import EXIT_NETWORK, EXIT_REFUSED, EXIT_SERVER
from gpupool_client.models import Job
from scheduler.models import Job as JobRow

SPEC = {"name": "train", "resources": {"flavors": ["sim-80g"], "gpus": 1}, "command": ["python", "train.py"]}


class LoseFirstAnswer(httpx.HTTPTransport):
    """Delivers every request to the server, but the answer to the first POST never comes back (a read timeout),
    as when a connection drops after the server committed the job."""

    def __init__(self) -> None:
        super().__init__()
        self.posts: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.method == "POST":
            self.posts.append(request)
            if len(self.posts) == 1:
                response.read()
                raise httpx.ReadTimeout("the answer was lost", request=request)
        return response


@pytest.mark.django_db(transaction=True)
def test_a_submit_whose_answer_was_lost_is_retried_and_creates_one_job(pool):
    transport = LoseFirstAnswer()
    with Client(pool.url, pool.member_token, transport=transport, sleep=lambda s: None) as client:
        result = client.submit(SPEC)
    assert len(transport.posts) == 2  # the first attempt reached the server, the retry too
    keys = {post.headers["Idempotency-Key"] for post in transport.posts}
    assert keys == {result.idempotency_key}
    assert result.replayed and result.job is not None and result.job.state == "queued"
    assert list(JobRow.objects.values_list("pk", flat=True)) == [result.job.id]

    # The caller's own key: the same submit again is answered, another spec under it refused.
    with Client(pool.url, pool.member_token) as client:
        first = client.submit(SPEC, idempotency_key="nightly-2026-12-03")
        again = client.submit(SPEC, idempotency_key="nightly-2026-12-03")
        with pytest.raises(RefusedError) as refused:
            client.submit({**SPEC, "name": "other"}, idempotency_key="nightly-2026-12-03")
    assert not first.replayed and again.replayed and again.job.id == first.job.id
    assert refused.value.code == "idempotency_key_reused" and refused.value.status == 422
    assert refused.value.exit_code == EXIT_REFUSED
    assert JobRow.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_pages_are_followed_until_the_last_row(pool):
    with Client(pool.url, pool.member_token) as client:
        submitted = [client.submit({**SPEC, "name": f"job-{n}"}).job.id for n in range(7)]
        pages = client.jobs(page_size=3)
        listed = [job.id for job in pages]
        limited = [job.id for job in client.jobs(page_size=3, limit=4)]
    assert listed == sorted(submitted, reverse=True) and pages.total == 7
    assert limited == listed[:4]


def mock_client(handler, **options) -> tuple[Client, list[float]]:
    slept: list[float] = []
    client = Client("http://pool.test", "gp_x", transport=httpx.MockTransport(handler), sleep=slept.append, **options)
    return client, slept


def test_429_and_503_are_retried_after_retry_after_or_a_growing_backoff():
    answers = iter(
        [
            httpx.Response(429, json={"code": "throttled", "detail": "slow down"}, headers={"Retry-After": "2"}),
            httpx.Response(503, text="<html>bad gateway</html>"),
            httpx.Response(503, text="<html>bad gateway</html>"),
            httpx.Response(200, json={"id": 5, "state": "running"}),
        ]
    )
    client, slept = mock_client(lambda request: next(answers), backoff_s=1.0)
    assert client.job(5).state == "running"
    assert slept[0] == 2.0  # Retry-After
    assert 1.0 <= slept[1] <= 2.0 and 2.0 <= slept[2] <= 4.0  # then a backoff that doubles (with jitter)


def test_retries_give_up_with_the_last_error_and_its_exit_code():
    client, slept = mock_client(lambda request: httpx.Response(503, json={"code": "busy", "detail": "later"}))
    with pytest.raises(ServerError) as raised:
        client.job(1)
    assert raised.value.code == "busy" and raised.value.exit_code == EXIT_SERVER
    assert len(slept) == client.max_retries


def test_a_lost_answer_to_a_cancel_is_not_sent_again():
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        raise httpx.ReadTimeout("no answer", request=request)

    client, _ = mock_client(handler, timeout_s=1.5)
    with pytest.raises(NetworkError) as raised:
        client.cancel(3)
    assert calls == ["POST"] and raised.value.exit_code == EXIT_NETWORK
    assert "did not answer within 1.5 s" in str(raised.value)


def test_a_refused_connection_is_retried_then_reported():
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    client, slept = mock_client(handler, max_retries=2)
    with pytest.raises(NetworkError, match=r"cannot reach http://pool\.test"):
        client.cancel(3)  # never reached the server: safe to send again, whatever the method
    assert len(slept) == 2


def test_models_keep_what_a_newer_server_adds_and_default_what_an_older_one_lacks():
    job = Job.from_api({"id": 1, "state": "queued", "estimated_start_at": "2026-12-03T10:00:00Z", "new_field": 3})
    assert job.estimated_start_at.isoformat() == "2026-12-03T10:00:00+00:00"
    assert job.raw["new_field"] == 3 and job.allocations == () and job.is_pending
    assert Job.from_api({"id": 2}).estimated_start_at is None
