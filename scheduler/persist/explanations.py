"""Pending explanations: only those that differ from what the jobs show are written, in one UPDATE; and the
plan's capacity holds, which replace the stored ones. See ``scheduler.persist``."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from django.db import connection

from kernel.db.bulk import AnyOf, update_rows
from scheduler.core import types as core
from scheduler.fleet.models import Device
from scheduler.models import CapacityHold, Job, JobState
from scheduler.persist.batch import plan_job_id

#: What a pending job shows: (reason code, message, position in its tenant, position overall).
StoredExplanation = tuple[str, str, int | None, int | None]


def changed_explanations(
    explanations: tuple[core.Explain, ...], *, stored: Mapping[int, StoredExplanation] | None
) -> list[tuple[int, str, str, int | None, int | None]]:
    """The explanations that differ from what the jobs show, as ``(pk, code, message, in tenant, overall)``.
    ``stored`` is what the snapshot read (``build_snapshot(stored_explanations=...)``); without it the jobs
    are read here. Only jobs still pending take an explanation (a running service scaling up does not)."""
    by_pk = {pk: e for e in explanations if (pk := plan_job_id(e.job_id)) is not None}
    if not by_pk:
        return []
    if stored is None:
        stored = {
            pk: (code, message, in_tenant, overall)
            for pk, code, message, in_tenant, overall in Job.objects.filter(
                AnyOf("pk", by_pk), state__in=[JobState.QUEUED, JobState.PENDING_APPROVAL]
            ).values_list("pk", "pending_reason_code", "pending_message", "position_in_tenant", "position_overall")
        }
    changed = []
    for pk, explain in by_pk.items():
        values = (str(explain.code), explain.message[:500], explain.position_in_tenant, explain.position_overall)
        current = stored.get(pk)
        if current is not None and values != current:
            changed.append((pk, *values))
    changed.sort()
    return changed


def explanations_write(rows: list[tuple[int, str, str, int | None, int | None]], *, known: bool = False) -> int:
    """The changed explanations in one UPDATE; a job that stopped pending meanwhile keeps its fields.

    ``known``: the caller keeps them (the live snapshot): the UPDATE says so to the change log's trigger
    (``gpupool.explanations_known``, migration 0014), which then does not log these jobs as changed — else
    every waiting job would be read again each time the queue moves."""
    if not rows:
        return 0
    if known and connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('gpupool.explanations_known', 'on', true)")
        try:
            return _explanations_update(rows)
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('gpupool.explanations_known', '', true)")
    return _explanations_update(rows)


def _explanations_update(rows: list[tuple[int, str, str, int | None, int | None]]) -> int:
    return update_rows(
        Job,
        columns=(
            ("id", "bigint"),
            ("code", "text"),
            ("message", "text"),
            ("in_tenant", "integer"),
            ("overall", "integer"),
        ),
        rows=rows,
        set_sql=(
            "pending_reason_code = v.code, pending_message = v.message, position_in_tenant = v.in_tenant, "
            "position_overall = v.overall"
        ),
        where_sql=f"AND state IN ('{JobState.QUEUED.value}', '{JobState.PENDING_APPROVAL.value}')",
    )


def holds_replace(holds: tuple[core.Hold, ...], *, now: datetime) -> None:
    """Store the plan's holds in place of the last cycle's (the engine returns every hold to keep)."""
    CapacityHold.objects.all().delete()
    if not holds:
        return
    jobs = set(Job.objects.filter(pk__in={plan_job_id(h.job_id) for h in holds}).values_list("pk", flat=True))
    devices = dict(Device.objects.filter(uuid__in={h.device_uuid for h in holds}).values_list("uuid", "pk"))
    rows: dict[int, CapacityHold] = {}
    for hold in holds:
        device = devices.get(hold.device_uuid)
        if plan_job_id(hold.job_id) not in jobs or device is None or device in rows:
            continue  # a job or device gone meanwhile; one preemptor per device (the engine keeps that too)
        rows[device] = CapacityHold(
            job_id=plan_job_id(hold.job_id),
            device_id=device,
            victim_ids=[int(v) for v in hold.victims if plan_job_id(v) is not None],
            since=datetime.fromtimestamp(hold.since, tz=UTC) if hold.since else now,
        )
    CapacityHold.objects.bulk_create(rows.values())
