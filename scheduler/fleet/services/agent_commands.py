"""Between agents and the scheduler: workload reports forwarded and applied, and the commands agents fetch
and acknowledge.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import IntegrityError, InterfaceError, OperationalError, transaction
from django.db.models import F
from django.utils import timezone

from scheduler.fleet.models import AgentReport
from scheduler.models import AgentCommand, Node

# --- workloads and the outbox ------------------------------------------------------------------------------


def workload_status_forward(*, node_id: int, status: dict) -> bool:
    """Pass a ``workload.status`` frame to ``scheduler.services.workload_status_report``.

    Returns False when the scheduler does not take reports yet.
    """
    return _forward(node=Node.objects.get(pk=node_id), status=status) is not None


#: Errors after which a report is not acknowledged, so the agent sends it again: the database was busy or
#: away (deadlock, serialization failure, lost connection, lock timeout), or a copy of the same report was
#: being applied at the same moment (the unique (node, report id) row). Anything else is permanent.
RETRYABLE_REPORT_ERRORS: tuple[type[BaseException], ...] = (OperationalError, InterfaceError, IntegrityError, OSError)


@dataclass(frozen=True)
class ReportOutcome:
    """The answer to one agent report (``report.ack``): ``code`` is empty when it was applied."""

    ok: bool = True
    code: str = ""
    detail: str = ""


def workload_report_apply(*, node_id: int, status: dict, now: datetime | None = None) -> ReportOutcome:
    """Apply a ``workload.status`` that carries a ``report_id``, exactly once per (node, report id).

    The report and the :class:`AgentReport` row that remembers it commit together: a report seen before (its
    ack was lost and the agent sent it again) is answered ``duplicate`` and changes nothing; a report whose
    transaction failed left no row and is applied when it comes again. Errors in
    :data:`RETRYABLE_REPORT_ERRORS` propagate (the caller does not ack); a ``DomainError`` propagates too and is
    acked as a refusal.
    """
    report_id = int(status["report_id"])
    if AgentReport.objects.filter(node_id=node_id, report_id=report_id).exists():
        return ReportOutcome(code="duplicate", detail=f"report {report_id} was applied before")
    with transaction.atomic():
        node = Node.objects.get(pk=node_id)
        outcome = _forward(node=node, status=status)
        # After the job (locked by the report) as the project's lock order wants: Job → ... → Node rows.
        AgentReport.objects.create(
            node=node,
            report_id=report_id,
            job_id=int(status["job_id"]),
            replica=int(status.get("replica") or 0),
            state=str(status["state"])[:16],
            outcome=(outcome or "unapplied")[:32],
            received_at=now or timezone.now(),
        )
    if outcome in (None, "applied"):
        return ReportOutcome()
    return ReportOutcome(code=outcome, detail=f"report {report_id} changed nothing: {outcome.replace('_', ' ')}")


def _forward(*, node: Node, status: dict) -> str | None:
    """``workload_status_report`` for one frame: its outcome, or None when the scheduler takes no reports."""
    from scheduler.fleet.telemetry import parse_time
    from scheduler.services.reports import workload_status_report as report

    checkpoint = status.get("last_checkpoint_at")
    outcome = report(
        node=node,
        job_id=int(status["job_id"]),
        replica=int(status.get("replica") or 0),
        state=str(status["state"]),
        exit_code=status.get("exit_code"),
        last_checkpoint_at=parse_time(checkpoint, default=None) if checkpoint else None,
        message=str(status.get("message") or ""),
        log_tail=str(status.get("log_tail") or ""),
        reason=str(status.get("reason") or ""),
        command_id=int(status.get("command_id") or 0),
    )
    return outcome if isinstance(outcome, str) else "applied"


def commands_pending(*, node_id: int, command_id: int | None = None) -> list[tuple[int, dict]]:
    """Unacknowledged commands of the node (or just ``command_id``), oldest first, marked sent now.

    Sent-but-unacked commands are sent again on reconnect; the agent deduplicates by ``command_id``.
    """
    rows = AgentCommand.objects.filter(node_id=node_id, acked_at__isnull=True).order_by("pk")
    if command_id is not None:
        rows = rows.filter(pk=command_id)
    commands = [(row.pk, row.payload) for row in rows]
    if commands:
        AgentCommand.objects.filter(pk__in=[pk for pk, _ in commands]).update(
            sent_at=timezone.now(), attempts=F("attempts") + 1
        )
    return commands


def command_ack(*, node_id: int, command_id: int, ok: bool = True, error: str = "") -> bool:
    """Mark the node's command acknowledged. Returns False for an id that is not this node's."""
    update = {
        "acked_at": timezone.now(),
        "ack_ok": ok,
        "error": error[: AgentCommand._meta.get_field("error").max_length],
    }
    return bool(AgentCommand.objects.filter(pk=command_id, node_id=node_id).update(**update))
