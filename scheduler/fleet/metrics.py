"""``/metrics``: Prometheus text exposition of the latest telemetry, with dcgm-exporter's metric names and
labels (so existing Grafana dashboards work), plus a few gpupool gauges.

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
    return "\n".join(lines) + "\n"


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
