"""Between agents and the scheduler: workload reports forwarded and applied, and the commands agents fetch
and acknowledge.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import IntegrityError, InterfaceError, OperationalError, connection, transaction
from django.db.models import F
from django.utils import timezone

from scheduler import messages as scheduler_messages
from scheduler.fleet.models import AgentCommand, AgentReport, Node
from scheduler.fleet.services.workload_reports import workload_status_report
from scheduler.fleet.telemetry import parse_time

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


_NODE_AND_REPORT_SEEN_SQL = (
    f"SELECT n.name, EXISTS(SELECT 1 FROM {AgentReport._meta.db_table} r WHERE r.node_id = n.id AND r.report_id = %s)"
    f" FROM {Node._meta.db_table} n WHERE n.id = %s"
)
_REPORT_INSERT_SQL = (
    f"INSERT INTO {AgentReport._meta.db_table} (node_id, report_id, job_id, replica, state, outcome, received_at)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s)"
)


def workload_report_apply(*, node_id: int, status: dict, now: datetime | None = None) -> ReportOutcome:
    """Apply a ``workload.status`` that carries a ``report_id``, exactly once per (node, report id).

    The report and the :class:`AgentReport` row that remembers it commit together: a report seen before (its
    ack was lost and the agent sent it again) is answered ``duplicate`` and changes nothing; a report whose
    transaction failed left no row and is applied when it comes again. Errors in
    :data:`RETRYABLE_REPORT_ERRORS` propagate (the caller does not ack); a ``DomainError`` propagates too and is
    acked as a refusal.
    """
    report_id = int(status["report_id"])
    # The node (its name is all a report reads of it) and whether the report was seen, in one statement before the
    # transaction, so a duplicate costs nothing more. Plain SQL here and for the report's row: composing these
    # through the ORM cost more CPU than the database spends on them, on every report of every agent.
    with connection.cursor() as cursor:
        cursor.execute(_NODE_AND_REPORT_SEEN_SQL, [report_id, node_id])
        row = cursor.fetchone()
    if row is None:
        raise Node.DoesNotExist(scheduler_messages.NO_NODE_ID(pk=node_id))
    if row[1]:
        return ReportOutcome(code="duplicate", detail=f"report {report_id} was applied before")
    node = Node.from_db(connection.alias, ["id", "name"], [node_id, row[0]])  # the other fields load if used
    with transaction.atomic():
        # The report is applied in this transaction, without a savepoint of its own: any error rolls both back.
        outcome = _forward(node=node, status=status, savepoint=False)
        # After the job (locked by the report) as the project's lock order wants: Job → ... → Node rows.
        with connection.cursor() as cursor:
            cursor.execute(
                _REPORT_INSERT_SQL,
                [
                    node_id,
                    report_id,
                    int(status["job_id"]),
                    int(status.get("replica") or 0),
                    str(status["state"])[:16],
                    (outcome or "unapplied")[:32],
                    connection.ops.adapt_datetimefield_value(now or timezone.now()),
                ],
            )
    if outcome in (None, "applied"):
        return ReportOutcome()
    return ReportOutcome(code=outcome, detail=f"report {report_id} changed nothing: {outcome.replace('_', ' ')}")


def _forward(*, node: Node, status: dict, savepoint: bool = True) -> str | None:
    """``workload_status_report`` for one frame: its outcome, or None when the scheduler takes no reports.

    ``savepoint=False``: the caller's transaction is open and rolls back whenever this raises."""

    checkpoint = status.get("last_checkpoint_at")
    outcome = workload_status_report(
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
        savepoint=savepoint,
    )
    return outcome if isinstance(outcome, str) else "applied"


def commands_pending(*, node_id: int, command_id: int | None = None) -> list[tuple[int, dict]]:
    """Unacknowledged commands of the node (or just ``command_id``), oldest first, marked sent now.

    Sent-but-unacked commands are sent again on reconnect; the agent deduplicates by ``command_id``. One
    ``UPDATE … RETURNING`` where the database has it (each command an agent gets passes through here).
    """
    if not connection.features.can_return_columns_from_insert:  # SQLite before 3.35: no RETURNING
        rows = AgentCommand.objects.filter(node_id=node_id, acked_at__isnull=True).order_by("pk")
        if command_id is not None:
            rows = rows.filter(pk=command_id)
        commands = list(rows.values_list("pk", "payload"))
        if commands:
            AgentCommand.objects.filter(pk__in=[pk for pk, _ in commands]).update(
                sent_at=timezone.now(), attempts=F("attempts") + 1
            )
        return commands
    sql = (
        f"UPDATE {AgentCommand._meta.db_table} SET sent_at = %s, attempts = attempts + 1"
        " WHERE node_id = %s AND acked_at IS NULL"
    )
    params = [connection.ops.adapt_datetimefield_value(timezone.now()), node_id]
    if command_id is not None:
        sql += " AND id = %s"
        params.append(command_id)
    with connection.cursor() as cursor:
        cursor.execute(sql + " RETURNING id, payload", params)
        rows = cursor.fetchall()
    payload_field = AgentCommand._meta.get_field("payload")
    return sorted((pk, payload_field.from_db_value(payload, None, connection)) for pk, payload in rows)


def command_ack(*, node_id: int, command_id: int, ok: bool = True, error: str = "") -> bool:
    """Mark the node's command acknowledged. Returns False for an id that is not this node's."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {AgentCommand._meta.db_table} SET acked_at = %s, ack_ok = %s, error = %s"
            " WHERE id = %s AND node_id = %s",
            [
                connection.ops.adapt_datetimefield_value(timezone.now()),
                ok,
                error[: AgentCommand._meta.get_field("error").max_length],
                command_id,
                node_id,
            ],
        )
        return cursor.rowcount > 0
