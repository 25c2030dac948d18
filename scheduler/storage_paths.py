"""Where a job's files live on the shared storage (``GPUPOOL_SHARED_STORAGE``), the same path on every node.

``<root>/tenants/<tenant id>/`` is a tenant's part, the only one its jobs see (the agents hide the rest);
``<root>/tenants/<tenant id>/jobs/<job id>/checkpoint`` a job's checkpoint dir: one per job, seen by every replica,
and by the job's next run wherever it is placed after a preemption or requeue. Ids, not slugs: a renamed tenant
keeps its files.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from tenants.services.quotas import tenant_storage_usage_record


def shared_root() -> str:
    return str(getattr(settings, "GPUPOOL_SHARED_STORAGE", "") or "").rstrip("/")


def tenant_dir(tenant_id: int) -> str | None:
    root = shared_root()
    return f"{root}/tenants/{tenant_id}" if root else None


def job_dir(tenant_id: int, job_id: int) -> str | None:
    base = tenant_dir(tenant_id)
    return f"{base}/jobs/{job_id}" if base else None


def checkpoint_dir(*, tenant_id: int, job_id: int, requested: str) -> str:
    """The checkpoint dir a job's replicas get: with shared storage, a relative (or no) ``checkpoint_dir`` of the
    spec lives in the job's directory there (``checkpoint`` when none was given); an absolute one is kept (it
    passed the tenant's prefixes at submit). Without shared storage, the spec's as it is."""
    base = job_dir(tenant_id, job_id)
    if base is None or requested.startswith("/"):
        return requested
    return posixpath.join(base, requested or "checkpoint")


def tree_size(root: Path) -> tuple[int, int]:
    """(bytes, files) of the regular files under ``root``, links not followed."""
    used = files = 0
    stack = [str(root)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    used += entry.stat(follow_symlinks=False).st_size
                    files += 1
            except OSError:
                continue
    return used, files


def measure_tenants() -> int:
    """Measure every tenant's part of the shared storage where this process sees it, and record the figures.
    Returns the tenants measured (0 without shared storage, or where it is not mounted here)."""
    root = shared_root()
    tenants_dir = Path(root) / "tenants" if root else None
    if tenants_dir is None or not tenants_dir.is_dir():
        return 0
    usage = {}
    for entry in os.scandir(tenants_dir):
        if entry.is_dir(follow_symlinks=False) and entry.name.isdigit():
            usage[int(entry.name)] = tree_size(Path(entry.path))
    return tenant_storage_usage_record(usage=usage, measured_at=timezone.now())
