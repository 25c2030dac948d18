"""``/metrics``: Prometheus text exposition of the latest telemetry, with dcgm-exporter's metric names and
labels (so existing Grafana dashboards work), plus gpupool's own: node readiness, jobs, pool capacity and
allocation (per flavor and per card), each tenant's usage against its quota, the queue wait, the audit trail's
sealing lag and PostgreSQL's deadlock count. ``deploy/grafana`` and ``deploy/prometheus`` read these names.

Scraped with ``Authorization: Bearer $GPUPOOL_METRICS_TOKEN``, or opened by a signed-in system admin.
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse

from scheduler.fleet import selectors

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# name, help, the telemetry field it reads
DEVICE_METRICS = [
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "utilization_pct"),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "memory_used_mib"),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "memory_free_mib"),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "power_w"),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "temperature_c"),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "sm_clock_mhz"),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Uncorrectable (double-bit) volatile ECC errors.", "ecc_errors"),
    ("DCGM_FI_DEV_XID_ERRORS", "Critical XID errors seen since the agent started.", "xid_errors"),
]


def _escape(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, object]) -> str:
    return "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in labels.items()) + "}"


def _number(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return repr(float(value)) if isinstance(value, float) else str(value)


def render_metrics(snapshot: dict) -> str:
    """The exposition text for ``selectors.metrics_snapshot()``."""
    lines: list[str] = []
    device_rows = []
    for device in snapshot["devices"]:
        values = dict(snapshot["latest"].get(device["node_id"], {}).get(device["uuid"], {}))
        if not values:
            continue
        total, used = values.get("memory_total_mib"), values.get("memory_used_mib")
        if _number(total) is not None and _number(used) is not None:
            values["memory_free_mib"] = max(0, total - used)
        labels = {
            "gpu": device["index"],
            "UUID": device["uuid"],
            "modelName": device["model"],
            "Hostname": device["node__name"],
            "node": device["node__name"],
            "flavor": device["flavor__name"] or "",
            "tenant": ",".join(sorted(snapshot["device_tenant"].get(device["uuid"], []))),
        }
        device_rows.append((_labels(labels), values))
    for name, help_text, field in DEVICE_METRICS:
        samples = [(labels, _number(values.get(field))) for labels, values in device_rows]
        samples = [(labels, value) for labels, value in samples if value is not None]
        if not samples:
            continue
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        lines += [f"{name}{labels} {value}" for labels, value in samples]

    lines += ["# HELP gpupool_node_ready 1 when the node is ready for placement.", "# TYPE gpupool_node_ready gauge"]
    for node in snapshot["nodes"]:
        ready = 1 if node["status"] == "ready" else 0
        lines.append(f"gpupool_node_ready{_labels({'node': node['name'], 'status': node['status']})} {ready}")
    lines += ["# HELP gpupool_jobs Jobs by state.", "# TYPE gpupool_jobs gauge"]
    for state, count in sorted(snapshot["jobs_by_state"].items()):
        lines.append(f"gpupool_jobs{_labels({'state': state})} {count}")
    lines += [
        "# HELP gpupool_allocated_millis Milli-devices held by active allocations (1000 = one card).",
        "# TYPE gpupool_allocated_millis gauge",
    ]
    for flavor, millis in sorted(snapshot["allocated_by_flavor"].items()):
        lines.append(f"gpupool_allocated_millis{_labels({'flavor': flavor})} {millis}")
    lines += _pool_lines(snapshot) + _tenant_lines(snapshot) + _queue_lines(snapshot) + _operations_lines(snapshot)
    return "\n".join(lines) + "\n"


def _family(name: str, kind: str, help_text: str, samples: list[tuple[dict[str, object], object]]) -> list[str]:
    """One metric family: HELP, TYPE and a line per sample (samples without a number are left out)."""
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for labels, value in samples:
        number = _number(value)
        if number is not None:
            lines.append(f"{name}{_labels(labels) if labels else ''} {number}")
    return lines


def _pool_lines(snapshot: dict) -> list[str]:
    capacity = [({"flavor": flavor}, millis) for flavor, millis in sorted(snapshot["capacity_by_flavor"].items())]
    device_names = {device["uuid"]: device for device in snapshot["devices"]}
    per_card = []
    for uuid, millis in sorted(snapshot["device_allocated"].items()):
        device = device_names.get(uuid)
        if device is not None:
            labels = {"gpu": device["index"], "UUID": uuid, "node": device["node__name"]}
            per_card.append(({**labels, "flavor": device["flavor__name"] or ""}, millis))
    return _family(
        "gpupool_capacity_millis",
        "gauge",
        "Milli-devices the scheduler may place: devices of ready nodes that are not unhealthy (1000 = one card).",
        capacity,
    ) + _family(
        "gpupool_device_allocated_millis", "gauge", "Milli-devices of one card held by active allocations.", per_card
    )


def _tenant_lines(snapshot: dict) -> list[str]:
    allocated = [
        ({"tenant": tenant, "flavor": flavor}, millis)
        for (tenant, flavor), millis in sorted(snapshot["tenant_allocated"].items())
    ]
    guaranteed = [({"tenant": t, "flavor": f}, g) for t, f, g, _limit in snapshot["tenant_quotas"]]
    limits = [({"tenant": t, "flavor": f}, limit) for t, f, _g, limit in snapshot["tenant_quotas"] if limit is not None]
    jobs = [({"tenant": tenant, "state": state}, n) for (tenant, state), n in sorted(snapshot["tenant_jobs"].items())]
    return (
        _family(
            "gpupool_tenant_allocated_millis", "gauge", "Milli-devices a tenant's active allocations hold.", allocated
        )
        + _family(
            "gpupool_tenant_guaranteed_millis", "gauge", "Milli-devices guaranteed by the tenant's quota.", guaranteed
        )
        + _family("gpupool_tenant_limit_millis", "gauge", "The tenant's quota limit (absent: no limit).", limits)
        + _family("gpupool_tenant_jobs", "gauge", "A tenant's unfinished jobs by state.", jobs)
    )


def _queue_lines(snapshot: dict) -> list[str]:
    quantiles = [({"quantile": q}, seconds) for q, seconds in sorted(snapshot["queue_wait_quantiles"].items())]
    return (
        _family(
            "gpupool_queue_wait_seconds",
            "gauge",
            "Seconds from queued to admitted, quantiles over the jobs admitted in the last 15 minutes "
            "(absent when none was).",
            quantiles,
        )
        + _family(
            "gpupool_queue_wait_jobs",
            "gauge",
            "Jobs admitted in the last 15 minutes (what gpupool_queue_wait_seconds is over).",
            [({}, snapshot["queue_wait_jobs"])],
        )
        + _family(
            "gpupool_queue_oldest_pending_seconds",
            "gauge",
            "How long the longest-waiting queued job has waited (0: none waits).",
            [({}, snapshot["queue_oldest_pending_seconds"])],
        )
    )


def _operations_lines(snapshot: dict) -> list[str]:
    lines = _family(
        "gpupool_audit_unwitnessed_seconds",
        "gauge",
        "Age of the oldest audit record no witnessed checkpoint covers yet (0: all sealed).",
        [({}, snapshot["audit_unwitnessed_seconds"])],
    ) + _family(
        "gpupool_audit_witness_window_seconds",
        "gauge",
        "Checkpoint interval + slack: audit_verify fails once a record this old is unsealed.",
        [({}, snapshot["audit_witness_window_seconds"])],
    )
    integrity = snapshot.get("audit_integrity") or {"findings": 0.0, "last_run": 0.0}
    lines += _family(
        "gpupool_audit_integrity_findings",
        "gauge",
        "Findings of the latest scheduled audit integrity check (0: the trail verified).",
        [({}, integrity["findings"])],
    ) + _family(
        "gpupool_audit_integrity_last_run_timestamp_seconds",
        "gauge",
        "When the scheduled audit integrity check last ran (Unix time; 0: never).",
        [({}, integrity["last_run"])],
    )
    if snapshot["database_deadlocks"] is not None:
        lines += _family(
            "gpupool_database_deadlocks_total",
            "counter",
            "Deadlocks PostgreSQL detected in the portal's database (pg_stat_database) since its statistics reset.",
            [({}, snapshot["database_deadlocks"])],
        )
    return lines


def _authorized(request: HttpRequest) -> bool:
    expected = settings.GPUPOOL_METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if expected and scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), expected.encode()):
        return True
    return selectors.is_telemetry_admin(request.user)


def metrics_view(request: HttpRequest) -> HttpResponse:
    if not _authorized(request):
        response = HttpResponse(
            "Unauthorized: send Authorization: Bearer <GPUPOOL_METRICS_TOKEN>, or sign in as a system admin.\n",
            status=401,
            content_type="text/plain; charset=utf-8",
        )
        response["WWW-Authenticate"] = 'Bearer realm="gpupool metrics"'
        return response
    return HttpResponse(render_metrics(selectors.metrics_snapshot()), content_type=CONTENT_TYPE)
