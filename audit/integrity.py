"""The scheduled integrity check: Celery beat runs it every ``GPUPOOL_AUDIT_INTEGRITY_CHECK_SECONDS`` (60).

Each run verifies, against the witness and the pinned trust root, every stream whose head moved (or whose
witnessed size moved) since the last run, end to end; the others get the cheap check (every record the witness
cosigned is still stored, and the cosigned checkpoint is the stored one). Once an hour (and on the first run) it
walks every stream. A finding is recorded in the trail (``audit.integrity_check``, witnessed at commit), raised as
an alert (log at CRITICAL on ``audit.alert`` and ``GPUPOOL_AUDIT_ALERT_HOOK``), exported to Prometheus
(``gpupool_audit_integrity_findings``; ``deploy/prometheus/alerts.yml`` pages on it) and shown in the console to
auditors and administrators until a run finds nothing.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.models import ChainHead, IntegrityCheck
from audit.services import audit_record, raise_alert
from audit.trail_verifier import verify_trail

FULL_EVERY = dt.timedelta(hours=1)


def run_integrity_check(*, now: dt.datetime | None = None, full: bool | None = None) -> IntegrityCheck:
    now = now or timezone.now()
    heads = dict(ChainHead.objects.values_list("stream", "seq"))
    last = IntegrityCheck.objects.first()
    last_full = IntegrityCheck.objects.filter(full=True).first()
    if full is None:
        full = last is None or last_full is None or now - last_full.ran_at >= FULL_EVERY
    changed = None if full else {s for s, seq in heads.items() if (last.heads or {}).get(s) != seq}
    report = verify_trail(record_result=False, now=now, only_streams=changed)
    findings = [f.as_dict() for f in report.findings[:50]]
    with transaction.atomic():
        check = IntegrityCheck.objects.create(
            ran_at=now,
            ok=report.ok,
            full=full,
            streams=report.streams,
            records=report.records,
            findings=findings,
            heads=heads,
        )
        if not report.ok:
            audit_record(
                action="audit.integrity_check",
                actor=None,
                target="audit",
                outcome="failure",
                details={"findings": findings, "full": full},
            )
    if not report.ok:
        summary = "; ".join(f.message for f in report.findings[:5])
        raise_alert(
            event="audit.integrity_check",
            message=f"the scheduled audit integrity check found {len(report.findings)} problem(s): {summary}",
            details={"findings": findings[:20]},
        )
    return check


def latest_failure() -> dict[str, Any] | None:
    """The newest run, when it found something (what the console's banner shows); None when the last run was
    clean or none ran."""
    check = IntegrityCheck.objects.first()
    if check is None or check.ok:
        return None
    return {"ran_at": check.ran_at, "count": len(check.findings), "first": (check.findings or [{}])[0].get("message")}
