"""Step 6, explain: every job left pending gets a reason code, a sentence and its queue positions.

Positions are 1-based and follow the order the cycle served the jobs in (priority, fair share, submit time),
counted among the jobs still pending: ``position_in_tenant`` among the jobs of the same tenant,
``position_overall`` among all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .types import Explain, PendingJob, PendingReason


@dataclass(frozen=True, slots=True)
class Pending:
    job: PendingJob
    code: PendingReason
    message: str


def explanations(pending: list[Pending]) -> tuple[Explain, ...]:
    per_tenant: dict[str, int] = {}
    out = []
    for overall, item in enumerate(pending, start=1):
        tenant = item.job.tenant
        per_tenant[tenant] = per_tenant.get(tenant, 0) + 1
        total = f"position {overall} in the queue, {per_tenant[tenant]} among {tenant}'s jobs"
        out.append(
            Explain(
                job_id=item.job.job_id,
                code=item.code,
                message=f"{item.message} ({total})",
                position_in_tenant=per_tenant[tenant],
                position_overall=overall,
                tenant=tenant,
            )
        )
    return tuple(out)
