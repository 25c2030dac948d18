"""Submitting one job (tenant, admission, rows, events), cancelling it, and releasing or rejecting it when its
admission request is decided.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from audit.services import audit_record
from catalog.models import ResourceFlavor
from kernel.access_rules import Action, principals_for
from kernel.api import ConflictError, DomainError, NotFoundError, PermissionDeniedError
from scheduler import messages as scheduler_messages
from scheduler.core import sentences
from scheduler.core.feasibility import FlavorFleet, QuotaLevel, never_fits
from scheduler.core.sentences import say
from scheduler.core.types import MILLIS_PER_DEVICE, ReplicaRequest
from scheduler.fleet import outbox
from scheduler.fleet.models import AgentCommand, Device, Node
from scheduler.jobspec import (
    JobNeverFitsError,
    JobSpec,
    JobSpecError,
    check_checkpoint_dir,
    check_flavors,
    validate_job_spec,
)
from scheduler.models import FINAL_JOB_STATES, Allocation, Job, PriorityClass
from scheduler.services.cycle import request_cycle
from scheduler.transitions import S, allocations_end, job_create, job_lock_for_update, job_transition
from tenants.access import reaches_all
from tenants.models import Membership, MembershipRole, Quota, Tenant
from tenants.permissions import can_manage_job
from tenants.services import admissions

# --- submit, cancel, approval -------------------------------------------------------------------------


#: The tenant columns a submit reads (the rest load on first access): no date columns, so SQLite's text dates
#: need no converter on this raw read.
_TENANT_SUBMIT_FIELDS = ("id", "name", "slug", "kind", "parent_id", "depth", "job_approval_threshold_millis")


def _resolve_tenant(
    *, actor: Any | None, slug: str | None, flavors: Sequence[str] = ()
) -> tuple[Any, list[tuple[int, int]], dict[str, FlavorFleet]]:
    """The tenant a job goes to, checked in one query: the tenant (``slug``, or else the actor's only tenant
    where they may submit) with its ancestors loaded on it (the approval threshold walks them) and their quota
    rows for ``flavors`` (``quota_rows``), whether ``actor`` holds a role on it or above it, and whether each of
    ``flavors`` exists. Returns the tenant; per flavor, its host defaults per card (CPU millicores, host memory
    MiB; ``_with_flavor_host_defaults``); and per flavor with registered cards, what its nodes can ever give.

    Refuses, in this order: an unknown flavor (``JobSpecError``, a spec error like any other), a tenant the
    actor cannot see (``NotFoundError``, the same as a missing one), a tenant where they may not submit.
    """

    # ``actor`` None is the system itself; any other actor must be a signed-in, active account (an anonymous
    # user sees no tenant at all, as in ``tenants.selectors.tenants_visible_to``).
    user = actor
    if user is not None and not (getattr(user, "is_authenticated", False) and user.is_active and user.pk):
        raise NotFoundError(scheduler_messages.NO_TENANT_VISIBLE_YOU(tenant=slug), code="not_found")
    if slug is None and user is None:
        raise DomainError(scheduler_messages.TENANT_SAY_WHICH_TENANT_JOB(), code="invalid_job_spec", field="tenant")
    # The tenant roles the access policy lets submit (job.submit), read from the table.
    submit_roles = [role for role in principals_for(Action.JOB_SUBMIT) if role in MembershipRole.values]
    chains, per_card, fleets = _tenant_chains(user=user, slug=slug, submit_roles=submit_roles, flavors=flavors)

    if flavors and not (chains and all(row is not None for row in per_card)):
        # Only a refused spec pays for this second read: the message lists the flavors that exist.
        check_flavors(flavors, set(ResourceFlavor.objects.values_list("name", flat=True)))
    defaults = [row for row in per_card if row is not None]
    if slug is None:
        if len(chains) != 1:
            raise DomainError(
                scheduler_messages.TENANT_YOU_BELONG_SEVERAL_TENANTS(),
                code="invalid_job_spec",
                field="tenant",
            )
        return chains[0], defaults, fleets
    tenant = chains[0] if chains else None
    if user is None:
        if tenant is None:
            raise NotFoundError(scheduler_messages.NO_TENANT_VISIBLE_YOU(tenant=slug), code="not_found")
        return tenant, defaults, fleets
    if tenant is None or not (tenant.holds_role or reaches_all(user, Action.TENANT_VIEW)):
        raise NotFoundError(scheduler_messages.NO_TENANT_VISIBLE_YOU(tenant=slug), code="not_found")
    if not tenant.may_submit:
        raise PermissionDeniedError(scheduler_messages.YOU_MAY_NOT_SUBMIT_JOBS(tenant=slug))
    return tenant, defaults, fleets


def submit_resolve(*, actor: Any | None, parsed: JobSpec) -> tuple[Any, JobSpec]:
    """The tenant a submit goes to (``_resolve_tenant``) and ``parsed`` with its flavors' host defaults, its
    checkpoint dir checked against the tenant, and refused when it can never start (``_refuse_never_fits``):
    what a single submit and an array share before admission."""
    tenant, per_card, fleets = _resolve_tenant(actor=actor, slug=parsed.tenant_slug, flavors=parsed.flavors)
    parsed = _with_flavor_host_defaults(parsed, per_card)
    check_checkpoint_dir(parsed.checkpoint_dir, tenant_slug=tenant.slug)
    _refuse_never_fits(parsed, tenant=tenant, fleets=fleets)
    return tenant, parsed


def _refuse_never_fits(parsed: JobSpec, *, tenant: Any, fleets: dict[str, FlavorFleet]) -> None:
    """Refuse, as ``sbatch`` does, a job that no registered node or no limit up its quota tree could ever give
    what it asks (``scheduler.core.feasibility``, the rule the cycle applies to queued jobs as well). A flavor
    with no registered card is judged by its quota tree only: a fresh pool accepts jobs before its nodes enrol.
    """
    gang = parsed.replicas if parsed.min_replicas is None else min(parsed.min_replicas, parsed.replicas)
    request = ReplicaRequest(
        flavors=parsed.flavors,
        millis=parsed.millis_per_replica,
        memory_mib=parsed.memory_mib_per_replica,
        cpu_millicores=parsed.cpu_millicores_per_replica,
        host_memory_mib=parsed.host_memory_mib_per_replica,
    )
    why = never_fits(
        request=request,
        replicas=gang,
        preemptible=parsed.preemptible,
        topology=parsed.topology,
        fleets=fleets,
        quota_paths=_quota_paths(tenant, parsed.flavors),
        replicas_field="min_replicas" if gang < parsed.replicas else "replicas",
    )
    if why is not None:
        raise JobNeverFitsError(
            scheduler_messages.NEVER_FITS(field=why.field, sentences=why.sentences, fix=why.fix), why=why
        )


def _quota_paths(tenant: Any, flavors: Sequence[str]) -> dict[str, tuple[QuotaLevel, ...]]:
    """Per flavor, the quota rows on ``tenant``'s way up, nearest first (``_tenant_chains`` loaded them)."""
    paths: dict[str, list[QuotaLevel]] = {}
    node = tenant
    while node is not None:
        for flavor in flavors:
            row = getattr(node, "quota_rows", {}).get(flavor)
            if row is not None:
                paths.setdefault(flavor, []).append(QuotaLevel(node.slug, *row))
        node = node.parent if node.parent_id is not None else None  # loaded with the chain: no query
    return {flavor: tuple(levels) for flavor, levels in paths.items()}


def _with_flavor_host_defaults(parsed: JobSpec, per_card: Sequence[tuple[int, int]]) -> JobSpec:
    """``parsed`` with the host CPU and memory its flavors give per card (``ResourceFlavor.*_per_card``, the
    largest over the flavors it names, so it fits wherever it lands) where its spec states none, times its
    cards per replica (a fraction gets its share, rounded up)."""
    cards = parsed.millis_per_replica / MILLIS_PER_DEVICE
    cpu, memory = parsed.cpu_millicores_per_replica, parsed.host_memory_mib_per_replica
    if not cpu:
        cpu = math.ceil(max((c for c, _ in per_card), default=0) * cards)
    if not memory:
        memory = math.ceil(max((m for _, m in per_card), default=0) * cards)
    if (cpu, memory) == (parsed.cpu_millicores_per_replica, parsed.host_memory_mib_per_replica):
        return parsed
    return dataclasses.replace(parsed, cpu_millicores_per_replica=cpu, host_memory_mib_per_replica=memory)


def _tenant_chains(
    *, user: Any | None, slug: str | None, submit_roles: list[str], flavors: Sequence[str]
) -> tuple[list[Any], list[tuple[int, int] | None], dict[str, FlavorFleet]]:
    """One statement for ``_resolve_tenant``: the candidate tenants (the one named ``slug``, or up to two where
    ``user`` may submit), each with its ancestors linked as ``parent`` and ``holds_role`` / ``may_submit``
    set on it (a role on the tenant or any ancestor) and ``quota_rows`` (flavor → (guaranteed, limit millis)
    of its quota rows for ``flavors``), each of ``flavors``' host defaults per card (None: no such flavor), and
    per flavor with registered cards what its nodes can ever give (``feasibility.FlavorFleet``: every
    registered card counts, whatever its node's state, as ``snapshot._nodes`` gives them to the cycle).

    Hand-written SQL (a recursive walk up the tree, which both PostgreSQL and SQLite run) rather than the ORM:
    compiling the equivalent queryset (four levels of ``select_related`` and two ``Exists`` over the ancestor
    chain) was 38 % of a submit's CPU, and this is the hot path of admission.
    """

    quote = connection.ops.quote_name
    tenants, memberships = quote(Tenant._meta.db_table), quote(Membership._meta.db_table)
    flavor_table = quote(ResourceFlavor._meta.db_table)
    devices, nodes, quotas = quote(Device._meta.db_table), quote(Node._meta.db_table), quote(Quota._meta.db_table)
    column_names = [quote(Tenant._meta.get_field(name).column) for name in _TENANT_SUBMIT_FIELDS]

    def columns(alias: str) -> str:
        return ", ".join(f"{alias}.{name}" for name in column_names)

    params: list[Any] = []
    if slug is not None:
        start = f"SELECT id FROM {tenants} WHERE slug = %s"
        params.append(slug)
    else:
        placeholders = ", ".join(["%s"] * len(submit_roles))
        start = (
            f"SELECT tenant_id AS id FROM {memberships} WHERE user_id = %s AND role IN ({placeholders}) "
            "ORDER BY tenant_id LIMIT 2"
        )
        params += [user.pk, *submit_roles]
    flags = []
    if user is not None:
        on_chain = "m.tenant_id IN (SELECT up.id FROM chain up WHERE up.start_id = c.start_id)"
        flags.append(f"EXISTS (SELECT 1 FROM {memberships} m WHERE m.user_id = %s AND {on_chain})")
        params.append(user.pk)
        placeholders = ", ".join(["%s"] * len(submit_roles))
        flags.append(
            f"EXISTS (SELECT 1 FROM {memberships} m WHERE m.user_id = %s AND m.role IN ({placeholders}) AND {on_chain})"
        )
        params += [user.pk, *submit_roles]
    for name in flavors:
        for column in ("cpu_millicores_per_card", "host_memory_mib_per_card"):  # NULL: no such flavor
            field = quote(ResourceFlavor._meta.get_field(column).column)
            flags.append(f"(SELECT {field} FROM {flavor_table} WHERE name = %s)")
            params.append(name)
    # Per flavor, one row of what its registered cards can ever give (``FlavorFleet``), and the chain's quota rows.
    fleet_ctes, fleet_params, joins, join_params = [], [], [], []
    for index, name in enumerate(flavors):
        flavor_id = f"(SELECT id FROM {flavor_table} WHERE name = %s)"
        fleet_ctes.append(
            f"fleet{index} AS (SELECT COALESCE(SUM(g.k), 0) AS cards, MAX(g.k) AS per_node, MAX(g.mem) AS max_mem, "
            "COALESCE(SUM(g.total), 0) AS total, MIN(g.cpu) AS min_cpu, MAX(g.cpu) AS max_cpu, "
            "MIN(g.host) AS min_host, MAX(g.host) AS max_host FROM (SELECT COUNT(*) AS k, MAX(d.memory_mib) AS mem, "
            "SUM(d.memory_mib) AS total, MAX(n.cpu_cores) AS cpu, MAX(n.memory_mib) AS host "
            f"FROM {devices} d JOIN {nodes} n ON n.id = d.node_id WHERE d.flavor_id = {flavor_id} "
            "GROUP BY d.node_id) g)"
        )
        fleet_params.append(name)
        flags += [f"fleet{index}.*", f"q{index}.guaranteed_millis", f"q{index}.limit_millis"]
        joins.append(
            f"CROSS JOIN fleet{index} LEFT JOIN {quotas} q{index} ON q{index}.tenant_id = c.id "
            f"AND q{index}.flavor_id = {flavor_id}"
        )
        join_params.append(name)
    sql = (
        f"WITH RECURSIVE start AS ({start}), chain AS ("
        f"SELECT {columns('t')}, 0 AS level, t.id AS start_id FROM {tenants} t JOIN start ON t.id = start.id "
        f"UNION ALL SELECT {columns('p')}, c.level + 1, c.start_id FROM {tenants} p JOIN chain c ON p.id = c.parent_id"
        f"){''.join(', ' + cte for cte in fleet_ctes)} SELECT {', '.join([columns('c'), 'c.start_id', *flags])} "
        f"FROM chain c {' '.join(joins)} ORDER BY c.start_id, c.level"
    )
    # Placeholders in the order they appear: the start, the fleets' CTEs, the select list, the joins.
    start_params = params[: start.count("%s")]
    params = [*start_params, *fleet_params, *params[len(start_params) :], *join_params]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()

    width = len(_TENANT_SUBMIT_FIELDS)
    chains: dict[int, list[Any]] = {}
    per_card: list[tuple[int, int] | None] = []
    fleets: dict[str, FlavorFleet] = {}
    for row in rows:
        tenant = Tenant.from_db(connection.alias, list(_TENANT_SUBMIT_FIELDS), row[:width])
        extra = row[width + 1 :]
        if user is not None:
            tenant.holds_role, tenant.may_submit = bool(extra[0]), bool(extra[1])
            extra = extra[2:]
        defaults, extra = extra[: 2 * len(flavors)], extra[2 * len(flavors) :]
        per_card = [
            None if cpu is None or memory is None else (int(cpu), int(memory))
            for cpu, memory in zip(defaults[0::2], defaults[1::2], strict=True)
        ]
        tenant.quota_rows = {}
        for index, name in enumerate(flavors):
            count, per_node, max_memory, memory, min_cpu, max_cpu, min_host, max_host, guaranteed, limit = extra[
                10 * index : 10 * (index + 1)
            ]
            if count:
                fleets[name] = FlavorFleet(
                    flavor=name,
                    cards=int(count),
                    max_cards_per_node=int(per_node),
                    max_card_memory_mib=int(max_memory),
                    memory_mib=int(memory),
                    # A node that has not stated its CPU or memory (0) is not limited on it, as in the snapshot.
                    max_node_cpu_millicores=int(max_cpu) * 1000 if min_cpu else None,
                    max_node_host_memory_mib=int(max_host) if min_host else None,
                )
            if guaranteed is not None:
                tenant.quota_rows[name] = (int(guaranteed), None if limit is None else int(limit))
        chains.setdefault(row[width], []).append(tenant)
    starts = []
    for chain in chains.values():
        # Each tenant's ``parent`` is the next one up, so walking the ancestors reads nothing more.
        for child, parent in zip(chain, [*chain[1:], None], strict=True):
            child._state.fields_cache["parent"] = parent
        starts.append(chain[0])
    return starts, per_card, fleets


APPROVAL_MESSAGE = sentences.JOB_WAITS_FOR_APPROVAL


def admission_for(*, tenant: Any, parsed: JobSpec) -> tuple[str, str, str]:
    """(state, reason, message) a new job enters with: ``pending_approval`` when the tenants app's rule asks
    for an approval (priority critical, or larger than the tenant's threshold), else ``queued``."""

    if admissions.job_admission_needs_approval(
        tenant=tenant,
        total_millis=parsed.total_millis,
        critical=parsed.priority_class >= PriorityClass.CRITICAL,
    ):
        return S.PENDING_APPROVAL, "approval_required", APPROVAL_MESSAGE
    return S.QUEUED, "submitted", ""


def new_job_from_spec(
    *,
    parsed: JobSpec,
    tenant: Any,
    submitter: Any | None,
    env: dict[str, str] | None = None,
    array_id: uuid.UUID | None = None,
    array_index: int | None = None,
) -> Job:
    """An unsaved job as ``parsed`` describes it; ``job_create`` / ``job_array_create`` give it its first state."""
    return Job(
        tenant=tenant,
        submitter=submitter,
        name=parsed.name,
        kind=parsed.kind,
        priority_class=parsed.priority_class,
        preemptible=parsed.preemptible,
        replicas=parsed.replicas,
        min_replicas=parsed.min_replicas,
        max_replicas=parsed.max_replicas,
        flavors=list(parsed.flavors),
        any_flavor=parsed.any_flavor,
        millis_per_replica=parsed.millis_per_replica,
        memory_mib_per_replica=parsed.memory_mib_per_replica,
        cpu_millicores_per_replica=parsed.cpu_millicores_per_replica,
        host_memory_mib_per_replica=parsed.host_memory_mib_per_replica,
        topology=parsed.topology,
        node_selector=parsed.node_selector,
        command=parsed.command,
        env=parsed.env if env is None else env,
        working_dir=parsed.working_dir,
        max_runtime_s=parsed.max_runtime_s,
        checkpoint_dir=parsed.checkpoint_dir,
        runtime_estimate_s=parsed.runtime_estimate_s,
        spec={**parsed.normalised, "tenant": tenant.slug},
        array_id=array_id,
        array_index=array_index,
    )


def _mark_loaded(job: Job, name: str, rows: list) -> None:
    """Give ``job.<name>`` the rows it has (what ``prefetch_related`` does after its query), so the job just
    created is serialized without reading back what was written."""
    queryset = getattr(job, name).all()
    queryset._result_cache = rows
    queryset._prefetch_done = True
    job.__dict__.setdefault("_prefetched_objects_cache", {})[name] = queryset


@dataclass(frozen=True)
class PreparedSubmit:
    """A single submit checked and resolved, nothing written yet (``job_submit_prepare``)."""

    actor: Any | None
    tenant: Any
    parsed: JobSpec
    state: str
    reason: str
    message: str
    idempotency_key: str
    request: Any | None


def job_submit_prepare(
    *, actor: Any | None, spec: dict, request: Any | None = None, idempotency_key: str = ""
) -> PreparedSubmit:
    """The reads and checks of a submit, before anything is written: the spec validated, the tenant resolved (one
    query), the job refused if it can never run, and the state it enters. Every refusal of a submit raises here,
    so its writes (``job_submit_write``) can share a transaction with other requests' (``kernel.db.group_commit``).
    """
    parsed = validate_job_spec(spec, check_flavor_names=False)
    if parsed.array_count is not None:
        raise JobSpecError(
            'array: submit job arrays through POST /api/v1/jobs/; here remove "array" to submit one job.', field="array"
        )
    tenant, parsed = submit_resolve(actor=actor, parsed=parsed)
    state, reason, message = admission_for(tenant=tenant, parsed=parsed)
    return PreparedSubmit(
        actor=actor,
        tenant=tenant,
        parsed=parsed,
        state=state,
        reason=reason,
        message=message,
        idempotency_key=idempotency_key,
        request=request,
    )


def job_submit_write(prepared: PreparedSubmit) -> Job:
    """The writes of a prepared submit, in the caller's transaction: the job already ``queued`` (or
    ``pending_approval``) with its two events in one insert, one audit record ``job.submit`` saying the state it
    entered, and a cycle request after the commit. The job returned has its events and (no) allocations loaded,
    ready to serialize."""
    actor, tenant, state, reason = prepared.actor, prepared.tenant, prepared.state, prepared.reason
    submitter = actor if getattr(actor, "pk", None) else None
    job = new_job_from_spec(parsed=prepared.parsed, tenant=tenant, submitter=submitter)
    job.idempotency_key = prepared.idempotency_key
    # Plain statements (``kernel.db.bulk``): composing them through the ORM was a fifth of a submit's CPU.
    events = job_create(job=job, to_state=state, reason=reason, message=prepared.message, now=timezone.now())
    audit_record(
        action="job.submit",
        actor=actor,
        tenant=tenant,
        target=f"job:{job.pk}",
        details={"after": {**job.spec, "state": state}, "reason": reason},
        request=prepared.request,
    )
    if state == S.PENDING_APPROVAL:
        admissions.job_admission_request_create(job=job, actor=actor)
    transaction.on_commit(request_cycle)
    _mark_loaded(job, "events", events)
    _mark_loaded(job, "allocations", [])
    return job


@transaction.atomic
def job_submit(*, actor: Any | None, spec: dict, request: Any | None = None, idempotency_key: str = "") -> Job:
    """Validate ``spec``, create the job and queue it (or hold it for approval). ``actor`` None = system.
    ``idempotency_key`` is stored on the job (``scheduler.idempotency`` answers a retried submit with it).

    The hot path of admission, a handful of statements in all: one query resolves the tenant, the actor's
    role and the flavors; the job is inserted already ``queued`` (or ``pending_approval``) with its two
    events in one insert; one audit record ``job.submit`` says the state it entered.
    """
    return job_submit_write(
        job_submit_prepare(actor=actor, spec=spec, request=request, idempotency_key=idempotency_key)
    )


@transaction.atomic
def job_cancel(*, job: Job, actor: Any | None, reason: str = "", request: Any | None = None) -> Job:
    """Cancel a job in any non-final state: it is ``cancelled`` at once and its running replicas get
    ``workload.stop``; each replica keeps its cards and ports until its agent reports the process ended (exited,
    or killed after the stop's grace), so no other job is placed on a card a process still uses. A replica whose
    start no agent has acknowledged never ran: its allocations end now. A node that never confirms the stop is
    swept (:func:`scheduler.fleet.services.workload_reports.jobs_awaiting_stop_sweep`) or declared lost."""
    job = job_lock_for_update(job)
    if actor is not None and not can_manage_job(actor, job):
        raise PermissionDeniedError(scheduler_messages.ONLY_SUBMITTER_TENANT_ADMIN_SYSTEM())
    if job.state in FINAL_JOB_STATES:
        raise ConflictError(
            scheduler_messages.JOB_ALREADY_THERE_NOTHING_CANCEL(pk=job.pk, state=job.state), code="job_finished"
        )
    outbox.stop_active_replicas(job=job, reason="cancelled")
    freed = allocations_end(_never_started(job)) > 0
    job_transition(
        job=job,
        to_state=S.CANCELLED,
        actor=actor,
        reason="cancelled",
        message=reason or sentences.CANCELLED,
        request=request,
    )
    if freed:
        transaction.on_commit(request_cycle)
    return job


def _never_started(job: Job):
    """The active allocations of ``job`` whose run's ``workload.start`` no agent has acknowledged."""
    started = {
        (node_id, (payload or {}).get("replica"))
        for node_id, payload in AgentCommand.objects.filter(
            job_id=job.pk, command_type="workload.start", acked_at__isnull=False
        ).values_list("node_id", "payload")
    }
    active = Allocation.objects.active().filter(job=job)
    runs = set(active.values_list("node_id", "replica"))
    never = Q(pk__in=[])
    for node_id, replica in runs - started:
        never |= Q(node_id=node_id, replica=replica)
    return active.filter(never)


@transaction.atomic
def job_release_from_approval(*, job: Job, actor: Any | None) -> Job:
    """An approved job leaves ``pending_approval`` for the queue (called by the tenants approval flow)."""
    job = job_lock_for_update(job)
    if job.state != S.PENDING_APPROVAL:
        raise ConflictError(
            scheduler_messages.JOB_NOT_WAITING_APPROVAL(pk=job.pk, state=job.state), code="invalid_transition"
        )
    job_transition(job=job, to_state=S.QUEUED, actor=actor, reason="approved", message=sentences.APPROVED)
    transaction.on_commit(request_cycle)
    return job


@transaction.atomic
def job_reject_from_approval(*, job: Job, actor: Any | None, comment: str = "") -> Job:
    """A rejected job fails with the approver's comment (called by the tenants approval flow)."""
    job = job_lock_for_update(job)
    if job.state != S.PENDING_APPROVAL:
        raise ConflictError(
            scheduler_messages.JOB_NOT_WAITING_APPROVAL(pk=job.pk, state=job.state), code="invalid_transition"
        )
    return job_transition(
        job=job,
        to_state=S.FAILED,
        actor=actor,
        reason="rejected",
        message=say(sentences.REJECTED, comment=comment)[:500],
    )
