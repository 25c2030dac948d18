"""Submits that are safe to retry: the ``Idempotency-Key`` header of ``POST /api/v1/jobs/``.

A client that lost the answer to a submit (a timeout, a dropped connection, a 503 from a proxy) sends the same
request again with the same key. The first submit stores the key on the job it created (on job 0 of an array);
the unique constraint ``job_idempotency_key_per_submitter`` (submitter, key) lets exactly one job carry it, also
when two copies of the request race each other. Every later submit with that key from that submitter creates
nothing and answers the job (or the array) of the first one, marked as a replay; a key reused for a different
spec is refused, so a client bug never silently returns the wrong job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError

from kernel.api import DomainError
from kernel.db.group_commit import GroupCommit
from scheduler import selectors
from scheduler.jobspec import validate_job_spec
from scheduler.models import Job, JobArray
from scheduler.selectors import ArrayState, array_state
from scheduler.services.arrays import job_array_submit
from scheduler.services.jobs import job_submit_prepare, job_submit_write

#: Longest key accepted (the column's length); a UUID (36) is the usual choice.
MAX_IDEMPOTENCY_KEY_LENGTH = 128
#: Printable ASCII without spaces: what an HTTP header carries unchanged through proxies.
IDEMPOTENCY_KEY_PATTERN = re.compile(rf"[\x21-\x7e]{{1,{MAX_IDEMPOTENCY_KEY_LENGTH}}}")


#: This process's group commit of single submits (``kernel.db.group_commit``).
SUBMITS = GroupCommit(name="submit-group-commit")


class IdempotencyKeyReused(DomainError):
    """The key belongs to a job submitted with a different spec."""

    code = "idempotency_key_reused"
    status_code = 422


@dataclass(frozen=True)
class SubmitOutcome:
    """What a submit answered: one job or an array, and whether it is the answer of an earlier submit."""

    job: Job | None = None
    array: ArrayState | None = None
    replayed: bool = False


def idempotency_key_clean(raw: str | None) -> str:
    """The key as stored: '' when none was sent; refuses one that is empty, too long or not plain ASCII."""
    if raw is None:
        return ""
    if not IDEMPOTENCY_KEY_PATTERN.fullmatch(raw):
        raise DomainError(
            f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_LENGTH} printable ASCII characters without spaces "
            "(a UUID is a good key); leave the header out to submit without one.",
            code="invalid_idempotency_key",
        )
    return raw


def job_submit_request(
    *, actor: Any, spec: Any, idempotency_key: str | None = None, request: Any | None = None
) -> SubmitOutcome:
    """Submit ``spec`` (one job, or an array when it has ``"array"``), at most once per ``idempotency_key``.

    Without a key this is ``jobs.job_submit`` / ``arrays.job_array_submit``. With one, a submit by the same
    actor that already used the key returns its job or array (``replayed``) instead of creating another; a race
    of two submits with one key ends with one job: the loser's insert violates the unique constraint, its
    savepoint rolls back (with its audit record and cycle request) and it answers the winner's job.
    """
    key = idempotency_key_clean(idempotency_key)
    is_array = isinstance(spec, dict) and spec.get("array") is not None
    if not key or not getattr(actor, "pk", None):
        return _submit(actor=actor, spec=spec, is_array=is_array, key="", request=request)
    first = _job_of_key(actor=actor, key=key)
    if first is not None:
        return _replay(first=first, actor=actor, spec=spec, key=key)
    try:
        # The submit's writes run in their own transaction (a group's, or a savepoint inside the caller's): one
        # that loses the race for the key rolls back, with its audit record and cycle request.
        return _submit(actor=actor, spec=spec, is_array=is_array, key=key, request=request)
    except IntegrityError:
        # Another request with this key committed its job while this one inserted: answer that job. Any other
        # integrity error leaves no job with the key behind and goes up as it was.
        first = _job_of_key(actor=actor, key=key)
        if first is None:
            raise
        return _replay(first=first, actor=actor, spec=spec, key=key)


def _submit(*, actor: Any, spec: Any, is_array: bool, key: str, request: Any | None) -> SubmitOutcome:
    if is_array:
        return SubmitOutcome(array=job_array_submit(actor=actor, spec=spec, request=request, idempotency_key=key))
    # Reads and refusals here, in the request's thread; the writes in a transaction shared with the submits other
    # requests of this process make meanwhile (group commit).
    prepared = job_submit_prepare(actor=actor, spec=spec, request=request, idempotency_key=key)
    return SubmitOutcome(job=SUBMITS.run(lambda: job_submit_write(prepared)))


def _job_of_key(*, actor: Any, key: str) -> Job | None:
    return Job.objects.select_related("tenant").filter(submitter=actor, idempotency_key=key).first()


def _replay(*, first: Job, actor: Any, spec: Any, key: str) -> SubmitOutcome:
    """The answer the first submit with ``key`` gave, after checking that ``spec`` asks for the same thing."""
    if not _same_request(first=first, spec=spec):
        what = f"the array {first.array_id}" if first.array_id else f"job {first.pk}"
        raise IdempotencyKeyReused(
            f"Idempotency-Key {key!r} was already used for {what} with a different spec; send a new key for a new "
            "job (the same key only repeats exactly the same submit)."
        )
    if first.array_id is None:
        return SubmitOutcome(job=selectors.job_get_visible(user=actor, pk=first.pk), replayed=True)
    record = JobArray.objects.filter(pk=first.array_id).first()
    if record is None:  # an array submitted before arrays were one record: its tasks are rows, counted as such
        count = Job.objects.filter(array_id=first.array_id).count()
        record = JobArray(array_id=first.array_id, head=first, tenant_id=first.tenant_id, count=count)
    array = array_state(record)
    return SubmitOutcome(array=array, replayed=True)


def _same_request(*, first: Job, spec: Any) -> bool:
    """Whether ``spec`` normalises to the spec ``first`` was created from (tenant left out: the same tenant)."""
    parsed = validate_job_spec(spec, check_flavor_names=False)
    if parsed.tenant_slug not in (None, first.tenant.slug):
        return False
    stored_count = int(first.env.get("GPUPOOL_ARRAY_COUNT", "0")) if first.array_id else None
    if parsed.array_count != stored_count:
        return False
    asked = {**parsed.normalised, "tenant": first.tenant.slug}
    return asked == first.spec
