"""Telling a job's owner, once, that their queued job can no longer ever start (nodes removed, a quota cut):
the cycle explains such a job as ``never_fits`` (``scheduler.core.feasibility``); this sends the news the first
cycle that does, not every cycle after.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from scheduler import messages as scheduler_messages
from scheduler.core.types import Explain, PendingReason
from scheduler.models import Job, JobState
from tenants.services.notifications import notification_queue

NEVER_FITS_EVENT = "job.never_fits"


def never_fits_notify(*, explanations: Sequence[Explain], stored: Mapping[int, tuple]) -> list[int]:
    """Queue a notification to the submitter of each job this cycle explains as ``never_fits`` whose stored
    reason was another (``stored``: pk → (code, message, …) as the snapshot read them, before this cycle wrote).
    A job that stays impossible is told once; one that fits again and later does not is told again. Returns the
    ids of the jobs whose owners were told."""
    newly = {}
    for explain in explanations:
        if explain.code != PendingReason.NEVER_FITS or not explain.job_id.isdigit():
            continue
        before = stored.get(int(explain.job_id))
        if before is not None and before[0] != PendingReason.NEVER_FITS:
            newly[int(explain.job_id)] = explain.message
    if not newly:
        return []
    jobs = Job.objects.filter(
        pk__in=newly, state__in=[JobState.QUEUED, JobState.PENDING_APPROVAL], submitter__isnull=False
    ).select_related("submitter", "tenant")
    told = []
    for job in jobs.order_by("pk"):
        notification_queue(
            event=NEVER_FITS_EVENT,
            recipients=[job.submitter],
            subject=scheduler_messages.GPUPOOL_JOB_CAN_NEVER_START(pk=job.pk, name=job.name[:60]),
            body=scheduler_messages.JOB_QUEUED_BUT_CAN_NO(
                pk=job.pk, name=job.name, tenant=job.tenant.slug, sentences=newly[job.pk]
            ),
        )
        told.append(job.pk)
    return told
