"""Jobs' outputs: what a replica left in its ``output_dir``, packed by its node's agent when it ended and stored
through Django's storage API (the ``outputs`` storage: local files by default, an S3-compatible store where
configured), one per replica; read by whoever may read the job (``scheduler.api.outputs``)."""

from __future__ import annotations

import hashlib
import tempfile
from typing import BinaryIO

from django.conf import settings
from django.core.files import File
from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from kernel.api import DomainError, NotFoundError
from scheduler import messages as scheduler_messages
from scheduler.fleet.models import Node
from scheduler.models import Allocation, Job, JobOutput

CHUNK = 1024 * 1024


class OutputRefused(DomainError):
    code = "output_refused"


def output_max_bytes() -> int:
    return int(getattr(settings, "GPUPOOL_OUTPUT_MAX_BYTES", 1024**3))


def job_output_store(*, node: Node, job_id: int, replica: int, stream: BinaryIO, sha256: str) -> JobOutput:
    """Store the packed output of ``job_id``/``replica`` sent by ``node``'s agent; replaces an earlier one of the
    same replica (a retried upload). Refused unless the node ran that replica, above ``GPUPOOL_OUTPUT_MAX_BYTES``,
    or when the content does not match ``sha256`` (a broken upload: the agent sends it again)."""
    job = Job.objects.filter(pk=job_id).only("pk", "tenant_id").first()
    if job is None or not Allocation.objects.filter(job_id=job_id, replica=replica, node=node).exists():
        raise NotFoundError(scheduler_messages.NODE_NEVER_RAN_REPLICA_JOB(node=node.name, replica=replica, job=job_id))
    limit = output_max_bytes()
    digest, size = hashlib.sha256(), 0
    with tempfile.SpooledTemporaryFile(max_size=8 * CHUNK) as spool:
        while chunk := stream.read(CHUNK):
            size += len(chunk)
            if size > limit:
                raise OutputRefused(scheduler_messages.OUTPUT_OVER_GPUPOOL_OUTPUT_MAX(n=limit))
            digest.update(chunk)
            spool.write(chunk)
        if digest.hexdigest() != sha256.lower():
            raise OutputRefused(scheduler_messages.UPLOAD_NOT_MATCH_SHA_SEND())
        spool.seek(0)
        with transaction.atomic():
            old = JobOutput.objects.select_for_update().filter(job_id=job_id, replica=replica).first()
            output = old or JobOutput(job_id=job_id, replica=replica)
            previous = old.file.name if old is not None else None
            output.node, output.size_bytes, output.sha256, output.created_at = (
                node,
                size,
                digest.hexdigest(),
                timezone.now(),
            )
            output.file.save(f"{job.tenant_id}/{job_id}/replica-{replica}.tar.gz", File(spool), save=False)
            output.save()
            audit_record(
                action="job.output_stored",
                actor=None,
                tenant=job.tenant_id,
                target=f"job:{job_id}",
                details={"replica": replica, "node": node.name, "size_bytes": size, "sha256": output.sha256},
            )
    if previous and previous != output.file.name:
        output.file.storage.delete(previous)
    return output
