"""The gpupool API client: typed results, pagination, retries with backoff, timeouts, safe submits.

    from gpupool_client import Client

    with Client.from_config() as pool:                  # GPUPOOL_URL / GPUPOOL_TOKEN, or `gpupool-cli login`
        result = pool.submit({"name": "train", "resources": {"flavors": ["nvidia-h100-80g"], "gpus": 1},
                              "command": ["python", "train.py"]})
        for job in pool.jobs(state=["queued", "running"]):
            print(job.id, job.state, job.pending_reason)

Retries: a request the server refused for load (429, 503) is sent again after ``Retry-After`` or an exponential
backoff with jitter, up to ``max_retries`` times; so is one that never reached the server (connection refused,
connect timeout). One whose answer was lost on the way back (read timeout, dropped connection) is sent again
only when repeating it is harmless: reads, and submits, which always carry an ``Idempotency-Key`` that the
server honours (the retry answers the job the first attempt created, never a second one).
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import httpx

from gpupool_client import __version__
from gpupool_client.config import DEFAULT_TIMEOUT_S, load_settings
from gpupool_client.errors import ApiError, NetworkError, NotFoundError, error_for
from gpupool_client.models import (
    ArrayCancelled,
    ArrayState,
    Device,
    Flavor,
    Job,
    JobArray,
    LogChunk,
    Me,
    Model,
    Node,
    Quota,
    QuotaUsage,
    Tenant,
)

logger = logging.getLogger(__name__)

API_PREFIX = "/api/v1/"
IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
#: Answers that mean "not done, try again later": the request is sent again whatever its method.
RETRY_STATUSES = frozenset({429, 503})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
DEFAULT_PAGE_SIZE = 100

T = TypeVar("T", bound=Model)


@dataclass(frozen=True)
class SubmitResult:
    """What a submit created: one ``job`` or an ``array``; ``replayed`` when the server answered an earlier
    submit with the same ``idempotency_key`` instead of creating anything."""

    idempotency_key: str
    job: Job | None = None
    array: JobArray | None = None
    replayed: bool = False

    @property
    def job_ids(self) -> tuple[int, ...]:
        """The jobs the submit made now: the job, or an array's task 0 (its other tasks become jobs later)."""
        if self.array is not None:
            return (self.array.first_job_id,) if self.array.first_job_id is not None else ()
        return (self.job.id,) if self.job is not None else ()


class Pages(Generic[T]):
    """The rows of a list endpoint, fetched a page at a time as you iterate (``limit``/``offset``).

    ``total`` is the server's count of matching rows once the first page has been read (None before). Pages
    follow by offset, not by the ``next`` link: behind a proxy that link may name an address the client
    cannot reach."""

    def __init__(
        self,
        client: Client,
        path: str,
        model: type[T],
        params: Mapping[str, Any] | None = None,
        *,
        page_size: int = DEFAULT_PAGE_SIZE,
        limit: int | None = None,
    ) -> None:
        self._client = client
        self._path = path
        self._model = model
        self._params = {key: value for key, value in (params or {}).items() if value not in (None, "", [], ())}
        self._page_size = page_size
        self._limit = limit
        self.total: int | None = None

    def __iter__(self) -> Iterator[T]:
        offset = 0
        yielded = 0
        while self._limit is None or yielded < self._limit:
            size = self._page_size if self._limit is None else min(self._page_size, self._limit - yielded)
            body = self._client.get_json(self._path, params={**self._params, "limit": size, "offset": offset})
            if isinstance(body, list):  # an endpoint without pagination answers the whole list
                self.total = len(body)
                rows = body if self._limit is None else body[: self._limit]
                yield from (self._model.from_api(row) for row in rows)
                return
            self.total = body.get("count")
            rows = body.get("results") or []
            for row in rows:
                yield self._model.from_api(row)
                yielded += 1
                if self._limit is not None and yielded >= self._limit:
                    return
            if not rows or not body.get("next"):
                return
            offset += len(rows)

    def all(self) -> list[T]:
        return list(self)


class Client:
    """A session with one gpupool server, authenticated by an API token (``Authorization: Bearer``).

    ``timeout_s`` bounds each attempt (connecting: at most 10 s of it); ``max_retries`` and ``backoff_s`` shape
    the retries described in the module's docstring. ``transport`` replaces the network (tests, proxies)."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"the server URL must start with http:// or https://, not {url!r}")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._sleep = sleep
        self._http = httpx.Client(
            base_url=self.url + API_PREFIX,
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/json",
                "User-Agent": f"gpupool-client/{__version__}",
            },
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)),
            transport=transport,
        )

    @classmethod
    def from_config(
        cls, *, url: str | None = None, token: str | None = None, timeout_s: float | None = None, **options: Any
    ) -> Client:
        """A client for the server of the environment (``GPUPOOL_URL``, ``GPUPOOL_TOKEN``) or the saved login."""
        settings = load_settings(url=url, token=token, timeout_s=timeout_s)
        return cls(settings.url, settings.token, timeout_s=settings.timeout_s, **options)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- transport ----------------------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
        repeatable: bool | None = None,
    ) -> httpx.Response:
        """Send one API request (``path`` relative to ``/api/v1/``) with retries; raise for an error answer.

        ``repeatable``: whether sending it twice is harmless (default: for GET, HEAD, OPTIONS)."""
        method = method.upper()
        if repeatable is None:
            repeatable = method in SAFE_METHODS
        attempt = 0
        while True:
            retry_after: float | None = None
            try:
                response = self._http.request(method, path, params=params, json=json, headers=headers)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                error: Exception = NetworkError(f"cannot reach {self.url}: {exc or type(exc).__name__}")
                retryable = True  # never reached the server: nothing happened there
            except httpx.TimeoutException:
                error = NetworkError(
                    f"{self.url} did not answer within {self.timeout_s:g} s (set GPUPOOL_TIMEOUT or --timeout "
                    "to wait longer)"
                )
                retryable = repeatable
            except httpx.TransportError as exc:
                error = NetworkError(f"the connection to {self.url} failed: {exc or type(exc).__name__}")
                retryable = repeatable
            else:
                if response.status_code < 400:
                    return response
                error = error_for(
                    status=response.status_code, body=_body(response), method=method, url=str(response.url)
                )
                retryable = response.status_code in RETRY_STATUSES
                retry_after = _retry_after_s(response)
            if not retryable or attempt >= self.max_retries:
                raise error
            delay = self._delay_s(attempt, retry_after)
            logger.info(
                "%s %s: %s; retry %d of %d in %.1f s", method, path, error, attempt + 1, self.max_retries, delay
            )
            self._sleep(delay)
            attempt += 1

    def _delay_s(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.max_backoff_s)
        # Exponential backoff with jitter: clients that failed together do not come back together.
        return min(self.max_backoff_s, self.backoff_s * 2**attempt) * random.uniform(0.5, 1.0)

    def get_json(self, path: str, *, params: Mapping[str, Any] | None = None) -> Any:
        return self.request("GET", path, params=params).json()

    def post_json(self, path: str, body: Any = None, *, headers: Mapping[str, str] | None = None) -> Any:
        response = self.request("POST", path, json=body if body is not None else {}, headers=headers)
        return response.json() if response.content else None

    def pages(self, path: str, model: type[T], params: Mapping[str, Any] | None = None, **options: Any) -> Pages[T]:
        return Pages(self, path, model, params, **options)

    # --- identity -----------------------------------------------------------------------------------------

    def me(self) -> Me:
        """Who the token belongs to: username, platform role, memberships."""
        return Me.from_api(self.get_json("me/"))

    # --- jobs ---------------------------------------------------------------------------------------------

    def jobs(
        self,
        *,
        state: str | Iterable[str] | None = None,
        tenant: str | None = None,
        submitter: str | None = None,
        name: str | None = None,
        kind: str | None = None,
        array: str | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        limit: int | None = None,
    ) -> Pages[Job]:
        """Jobs you can see, newest first; each filter narrows (``state`` may list several states)."""
        states = [state] if isinstance(state, str) else list(state or [])
        params = {"state": states, "tenant": tenant, "submitter": submitter, "name": name, "kind": kind, "array": array}
        return self.pages("jobs/", Job, params, page_size=page_size, limit=limit)

    def job(self, job_id: int) -> Job:
        """One job with its spec, allocations and events."""
        return Job.from_api(self.get_json(f"jobs/{int(job_id)}/"))

    def submit(self, spec: Mapping[str, Any], *, idempotency_key: str | None = None) -> SubmitResult:
        """Submit a job spec (an array when it has ``"array": {"count": N}``).

        Every submit carries an ``Idempotency-Key`` (a new UUID unless you pass one): retries after a lost
        answer are then safe, and so is calling ``submit`` again with the same key yourself."""
        key = idempotency_key or str(uuid.uuid4())
        response = self.request(
            "POST", "jobs/", json=dict(spec), headers={IDEMPOTENCY_KEY_HEADER: key}, repeatable=True
        )
        body = response.json()
        replayed = response.headers.get(REPLAYED_HEADER, "").lower() == "true"
        if isinstance(body, dict) and "array_id" in body and "count" in body:
            return SubmitResult(idempotency_key=key, array=JobArray.from_api(body), replayed=replayed)
        return SubmitResult(idempotency_key=key, job=Job.from_api(body), replayed=replayed)

    def cancel(self, job_id: int, *, reason: str = "") -> Job:
        """Cancel a job that has not ended (a finished one is a ``RefusedError``, code ``job_finished``)."""
        return Job.from_api(self.post_json(f"jobs/{int(job_id)}/cancel/", {"reason": reason}))

    def cancel_array(self, array_id: str, *, reason: str = "", indices: str | None = None) -> ArrayCancelled:
        """Cancel every task of an array that has not ended, or only ``indices`` ("3-7,9")."""
        body: dict[str, Any] = {"reason": reason}
        if indices is not None:
            body["indices"] = indices
        return ArrayCancelled.from_api(self.post_json(f"jobs/arrays/{array_id}/cancel/", body))

    def array_state(self, array_id: str) -> ArrayState:
        """An array with every task counted by state (tasks that are not jobs yet count as queued)."""
        return ArrayState.from_api(self.get_json(f"jobs/arrays/{array_id}/"))

    def array_task(self, array_id: str, index: int) -> Job:
        """Task ``index`` of an array as a job (the server makes it one if it was still waiting)."""
        return Job.from_api(self.get_json(f"jobs/arrays/{array_id}/tasks/{int(index)}/"))

    def outputs(self, job_id: int) -> list[dict[str, Any]]:
        """What each replica left in the job's ``output_dir``: ``{replica, size_bytes, sha256, created_at,
        download_url}``, collected when the replica ended."""
        return list(self.get_json(f"jobs/{int(job_id)}/outputs/"))

    def download_output(self, job_id: int, replica: int, target: Path) -> Path:
        """Save one replica's output (.tar.gz) as ``target``; returns it."""
        response = self.request("GET", f"jobs/{int(job_id)}/outputs/{int(replica)}/")
        target.write_bytes(response.content)
        return target

    def logs(self, job_id: int, *, replica: int = 0, offset: int = 0) -> LogChunk:
        """The output of one replica from byte ``offset`` on (as much as the server sends at once)."""
        body = self.get_json(f"jobs/{int(job_id)}/logs/", params={"replica": replica, "offset": offset})
        return LogChunk.from_api(body)

    def follow_logs(
        self, job_id: int, *, replica: int = 0, offset: int = 0, follow: bool = True, poll_s: float = 1.0
    ) -> Iterator[LogChunk]:
        """The replica's output as it grows: each new piece once, in order, until the server says it is
        ``complete`` (the job has ended and everything was read). Without ``follow``, stops once caught up."""
        while True:
            chunk = self.logs(job_id, replica=replica, offset=offset)
            if chunk.text or chunk.next_offset != offset:
                yield chunk
            if chunk.complete:
                return
            if chunk.next_offset != offset:
                offset = chunk.next_offset
                continue
            if not follow:
                return
            self._sleep(poll_s)

    # --- tenants and quotas -------------------------------------------------------------------------------

    def tenants(self, *, limit: int | None = None) -> Pages[Tenant]:
        return self.pages("tenants/", Tenant, limit=limit)

    def quota_usage(self, tenant_id: int, *, tenant_slug: str = "") -> list[QuotaUsage]:
        """A tenant's guarantee, limit and use per flavor now (millis; 1000 = one card)."""
        rows = self.get_json(f"tenants/{int(tenant_id)}/quota-usage/")
        return [QuotaUsage.from_api({**row, "tenant": tenant_slug or str(tenant_id)}) for row in rows]

    def quotas(self, *, tenant: int | None = None, limit: int | None = None) -> Pages[Quota]:
        return self.pages("quotas/", Quota, {"tenant": tenant}, limit=limit)

    # --- resources ----------------------------------------------------------------------------------------

    def nodes(self, *, status: str | None = None, limit: int | None = None) -> Pages[Node]:
        return self.pages("nodes/", Node, {"status": status}, limit=limit)

    def devices(self, *, node: str | None = None, flavor: str | None = None, limit: int | None = None) -> Pages[Device]:
        return self.pages("devices/", Device, {"node": node, "flavor": flavor}, limit=limit)

    def flavors(self) -> Pages[Flavor]:
        return self.pages("flavors/", Flavor)

    # --- administration -----------------------------------------------------------------------------------

    def whatif(self, changes: Mapping[str, object], *, days: float = 30) -> dict[str, Any]:
        """System admins: replay the last ``days`` under the policy in force and with ``changes`` (scheduler
        policy settings, values as ``gpupool whatif --set`` takes them: ``{"preemption": "false"}``); the
        server's comparison as sent (``metrics``: per metric current, proposed, change, better).

        Raises ``NotFoundError`` (code ``whatif_unavailable``) when the server has no what-if endpoint."""
        try:
            return self.post_json("whatif/", {"days": days, "set": dict(changes)})
        except ApiError as exc:
            # 405, or the 404 the server gives a URL no route matches (not one of the endpoint's own 404s).
            if exc.status == 405 or (exc.status == 404 and "endpoint" in exc.detail):
                raise NotFoundError(
                    status=exc.status,
                    code="whatif_unavailable",
                    detail=(
                        f"{self.url} has no what-if API (POST {API_PREFIX}whatif/); an administrator can run "
                        "`gpupool whatif` on the server instead."
                    ),
                ) from None
            raise


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def _retry_after_s(response: httpx.Response) -> float | None:
    """``Retry-After`` in seconds (the HTTP-date form is rare for APIs and treated as absent)."""
    value = response.headers.get("Retry-After", "")
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None
