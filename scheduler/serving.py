"""Serving endpoints: a job's named ports (its spec's ``ports``), reached through the deployment's Caddy.

The portal keeps one route in Caddy (``"@id": "gpupool-serving"``, matching ``/serve/*``) through Caddy's admin
API: a subroute per endpoint ``/serve/jobs/<job>/<port name>/`` that

1. asks the portal whether the caller may use the job (Caddy's ``forward_auth``: the request's cookie or bearer
   token go to ``/api/v1/serving/auth/<job>/<name>/``, which answers 200, or 401/404 as the API would — another
   tenant's job is a 404 — and that answer is what the caller gets);
2. drops the caller's ``Authorization`` and ``Cookie`` headers (the job's code never sees the user's token);
3. strips the prefix and load-balances (round robin) over the replicas' ``address:port``, sending traffic only to
   replicas whose readiness check (``ready_path``, every second) passes, retrying another replica for up to 5 s
   when one refuses a connection.

A replica is in the route while its job is admitted or running and the replica holds its cards and is not being scaled
down. A stop (preemption, scale-down, cancel) syncs the route *before* the stop is announced to the node
(``scheduler.fleet.outbox``: the sync is the earlier on-commit callback), so a replica taken back stops receiving
traffic first; its SIGTERM waits ``GPUPOOL_SERVING_DRAIN_S`` (2 s) for the requests already routed to it. Placements
sync after commit; beat syncs every ``GPUPOOL_SERVING_SYNC_S`` (a restarted Caddy gets its route back). Without
``GPUPOOL_SERVING_CADDY_ADMIN`` (embedded mode, development) nothing is configured: the API lists each replica's
direct ``address:port``, reachable from the pool's own network only, with no access check.

The route goes into ``GPUPOOL_SERVING_CADDY_SERVER`` (default ``gpupool-serving``): an existing server of the
operator's Caddyfile (``srv0``: the portal's own site, with its TLS) gets it as its first route; a server that does
not exist is created listening on ``GPUPOOL_SERVING_LISTEN``.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections import defaultdict
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef

from scheduler.models import Allocation, Job, JobState, ReplicaPort

logger = logging.getLogger(__name__)

ROUTE_ID = "gpupool-serving"
PREFIX = "/serve"
SERVING_STATES = (JobState.ADMITTED, JobState.RUNNING)
_SECOND_NS = 1_000_000_000


@dataclass(frozen=True)
class Endpoint:
    job_id: int
    name: str
    ready_path: str
    upstreams: tuple[str, ...]  # "address:port" of each replica in the route

    @property
    def path(self) -> str:
        return f"{PREFIX}/jobs/{self.job_id}/{self.name}"


def caddy_admin() -> str:
    return str(getattr(settings, "GPUPOOL_SERVING_CADDY_ADMIN", "") or "").rstrip("/")


def public_url(job_id: int, name: str) -> str | None:
    """The endpoint's URL for users, or None without a proxy (embedded mode)."""
    if not caddy_admin():
        return None
    base = str(getattr(settings, "GPUPOOL_SERVING_URL", "") or "").rstrip("/")
    return f"{base}{PREFIX}/jobs/{job_id}/{name}/"


def _dial(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def endpoints_desired(job_ids: list[int] | None = None) -> list[Endpoint]:
    """Every endpoint with the replicas that should receive its traffic now (see the module docstring)."""
    holding = Allocation.objects.filter(
        job_id=OuterRef("job_id"), replica=OuterRef("replica"), node_id=OuterRef("node_id"), ended_at__isnull=True
    )
    rows = ReplicaPort.objects.filter(purpose=ReplicaPort.Purpose.NAMED).filter(Exists(holding))
    if job_ids is not None:
        rows = rows.filter(job_id__in=job_ids)
    rows = rows.values_list(
        "job_id", "name", "replica", "port", "node__address", "node__name", "job__state", "job__scaling_down_replicas"
    ).order_by("job_id", "name", "replica")
    upstreams: dict[tuple[int, str], list[str]] = defaultdict(list)
    for job_id, name, replica, port, address, node_name, state, scaling_down in rows:
        if state in SERVING_STATES and replica not in (scaling_down or []):
            upstreams[(job_id, name)].append(_dial(address or node_name, port))
        else:
            upstreams.setdefault((job_id, name), [])
    jobs = Job.objects.filter(pk__in={job_id for job_id, _ in upstreams}).values_list("pk", "spec")
    ready = {
        (pk, str(port["name"])): str(port.get("ready_path") or "/")
        for pk, spec in jobs
        for port in (spec or {}).get("ports") or []
    }
    return [
        Endpoint(job_id=job_id, name=name, ready_path=ready.get((job_id, name), "/"), upstreams=tuple(hosts))
        for (job_id, name), hosts in sorted(upstreams.items())
        if hosts  # a job none of whose replicas serves has no route: its URL answers 404
    ]


def caddy_route(endpoints: list[Endpoint]) -> dict:
    """The one route the portal owns in Caddy: ``/serve/*``, a subroute per endpoint, 404 for the rest."""
    portal = [{"dial": dial} for dial in getattr(settings, "GPUPOOL_SERVING_PORTAL", ["127.0.0.1:8000"])]
    routes = []
    for endpoint in endpoints:
        forward_auth = {
            "handler": "reverse_proxy",
            "upstreams": portal,
            "rewrite": {"method": "GET", "uri": f"/api/v1/serving/auth/{endpoint.job_id}/{endpoint.name}/"},
            "headers": {
                "request": {
                    "set": {"X-Forwarded-Method": ["{http.request.method}"], "X-Forwarded-Uri": ["{http.request.uri}"]}
                }
            },
            # A 2xx lets the request through; any other answer (401, 404) is what the caller gets.
            "handle_response": [
                {
                    "match": {"status_code": [2]},
                    "routes": [
                        {
                            "handle": [
                                {
                                    "handler": "headers",
                                    "request": {
                                        "set": {"X-Gpupool-User": ["{http.reverse_proxy.header.X-Gpupool-User}"]}
                                    },
                                }
                            ]
                        }
                    ],
                }
            ],
        }
        upstream = {
            "handler": "reverse_proxy",
            "upstreams": [{"dial": dial} for dial in endpoint.upstreams],
            "load_balancing": {
                "selection_policy": {"policy": "round_robin"},
                "try_duration": 5 * _SECOND_NS,
                "try_interval": _SECOND_NS // 4,
            },
            "health_checks": {
                "active": {"uri": endpoint.ready_path, "interval": _SECOND_NS, "timeout": _SECOND_NS},
                "passive": {"fail_duration": 10 * _SECOND_NS},
            },
        }
        routes.append(
            {
                "match": [{"path": [endpoint.path, f"{endpoint.path}/*"]}],
                "handle": [
                    {
                        "handler": "subroute",
                        "routes": [
                            {"handle": [{"handler": "rewrite", "strip_path_prefix": endpoint.path}]},
                            {
                                "handle": [
                                    forward_auth,
                                    {"handler": "headers", "request": {"delete": ["Authorization", "Cookie"]}},
                                    upstream,
                                ]
                            },
                        ],
                    }
                ],
                "terminal": True,
            }
        )
    routes.append({"handle": [{"handler": "static_response", "status_code": 404, "body": "no such endpoint\n"}]})
    return {
        "@id": ROUTE_ID,
        "match": [{"path": [PREFIX, f"{PREFIX}/*"]}],
        "handle": [{"handler": "subroute", "routes": routes}],
        "terminal": True,
    }


class CaddyError(RuntimeError):
    pass


def _admin(method: str, path: str, body: object | None = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        caddy_admin() + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        raise CaddyError(f"{method} {path}: {exc.code} {exc.read()[:300]!r}") from None
    except OSError as exc:
        raise CaddyError(f"{method} {path}: {exc}") from None
    return json.loads(raw) if raw.strip() else None


def _put_route(route: dict) -> None:
    """Replace the portal's route, or put it in place the first time (in a new server, or first in an existing
    one)."""
    try:
        _admin("PATCH", f"/id/{ROUTE_ID}", route)
        return
    except CaddyError:
        pass  # not there yet (a new Caddy, or one restarted from its Caddyfile)
    server = str(getattr(settings, "GPUPOOL_SERVING_CADDY_SERVER", "") or "gpupool-serving")
    listen = [str(getattr(settings, "GPUPOOL_SERVING_LISTEN", ":8443"))]
    new_server = {"listen": listen, "routes": [route]}
    config = _admin("GET", "/config/") or {}
    apps = config.get("apps") if isinstance(config, dict) else None
    http = (apps or {}).get("http")
    if apps is None:
        _admin("POST", "/config/apps", {"http": {"servers": {server: new_server}}})
    elif http is None:
        _admin("POST", "/config/apps/http", {"servers": {server: new_server}})
    elif (http.get("servers") or {}).get(server) is None:
        _admin("POST", f"/config/apps/http/servers/{server}", new_server)
    else:
        _admin("PUT", f"/config/apps/http/servers/{server}/routes/0", route)


def serving_sync() -> bool:
    """Make Caddy route every endpoint to the replicas that should serve it now. Returns False without a proxy
    configured (embedded mode) or when Caddy could not be reached (logged; the next sync tries again)."""
    if not caddy_admin():
        return False
    endpoints = endpoints_desired()
    try:
        _put_route(caddy_route(endpoints))
    except CaddyError as exc:
        logger.warning("serving: could not configure Caddy at %s: %s", caddy_admin(), exc)
        return False
    logger.debug("serving: %d endpoint(s) routed", len(endpoints))
    return True


def stop_drain_s(job: Job) -> float:
    """Seconds a stopped replica of ``job`` keeps running before its SIGTERM (``workload.stop``'s ``drain_s``):
    ``GPUPOOL_SERVING_DRAIN_S`` for a job with endpoints behind the proxy, 0 otherwise. The route drops it first,
    but a request Caddy had already matched under the old route (waiting on ``forward_auth``, or retrying) still
    goes to it."""
    if caddy_admin() and (job.spec or {}).get("ports"):
        return max(0.0, float(getattr(settings, "GPUPOOL_SERVING_DRAIN_S", 2.0)))
    return 0.0


def sync_on_commit(job: Job) -> None:
    """Sync the proxy after the caller's transaction commits, if ``job`` has endpoints; called before the stop of a
    replica is written, so the sync runs before the stop is announced (on-commit callbacks run in order)."""
    if caddy_admin() and (job.spec or {}).get("ports"):
        transaction.on_commit(serving_sync)


def job_endpoints(job: Job) -> list[dict]:
    """``job``'s endpoints for the API: name, URL (None without a proxy) and the replicas serving it."""
    names = [str(port["name"]) for port in (job.spec or {}).get("ports") or []]
    if not names:
        return []
    if job.state not in SERVING_STATES:  # nothing serves (and the database is not asked: a submit's answer)
        return [{"name": name, "url": public_url(job.pk, name), "replicas": []} for name in names]
    serving = {endpoint.name: endpoint.upstreams for endpoint in endpoints_desired([job.pk])}
    return [{"name": name, "url": public_url(job.pk, name), "replicas": list(serving.get(name, ()))} for name in names]
