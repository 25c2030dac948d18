"""Console tables (django-tables2): sortable columns; filters come from the filtersets, both live in the URL."""

from __future__ import annotations

from datetime import datetime

import django_tables2 as tables
from django.db.models import Case, F, Value, When
from django.utils import timezone
from django.utils.html import format_html
from django.utils.translation import gettext, pgettext
from django.utils.translation import gettext_lazy as _

from frontend.audit_details import role_words
from frontend.datetimes import format_moment
from scheduler.core.types import PendingReason
from scheduler.fleet.models import Node, NodeStatus
from scheduler.models import ACTIVE_JOB_STATES, FINAL_JOB_STATES, PENDING_JOB_STATES, JobState
from scheduler.selectors import QueuePosition, job_pending_sentence, job_start_estimate_words, queue_order


class BadgeColumn(tables.Column):
    """A choice field shown as a coloured badge; the class is the raw value so CSS can colour it."""

    def render(self, value, record, bound_column):
        # ``value`` is already the label for a field with choices (django-tables2 calls get_FOO_display), which
        # in Chinese made the class "已取消" instead of "cancelled": take the stored value for the class.
        raw = tables.A(bound_column.accessor).resolve(record)
        display = getattr(record, f"get_{bound_column.accessor}_display", None)
        label = display() if callable(display) else value
        return format_html('<span class="badge {}">{}</span>', raw, label)

    def value(self, value, record, bound_column):
        return value


class WhenColumn(tables.Column):
    """A moment in the page language's one format (``frontend.datetimes``); exports keep the plain ISO text."""

    def __init__(self, *args, seconds: bool = False, **kwargs) -> None:
        self.seconds = seconds
        super().__init__(*args, **kwargs)

    def render(self, value):
        return format_moment(value, seconds=self.seconds)

    def value(self, value):
        return value.strftime("%Y-%m-%d %H:%M:%S") if value else ""


class ConsoleTable(tables.Table):
    class Meta:
        attrs = {"class": "data"}
        per_page = 50


#: How a draining node that no job holds any more is shown (it stays out of service until returned to it).
DRAINED = "drained"


def node_status_shown(status: str, *, holds_work: bool) -> tuple[str, str]:
    """The status code and label a node is shown with. A drain has no end state of its own (the node stays
    ``draining`` until an admin returns it to service), so a draining node whose jobs have all stopped and moved
    is shown as "drained": safe to take down, distinct from "draining" while jobs still stop."""
    if status == NodeStatus.DRAINING and not holds_work:
        return DRAINED, pgettext("node status", "drained")
    try:
        return status, str(NodeStatus(status).label)
    except ValueError:
        return status, gettext(status)


class NodeTable(ConsoleTable):
    name = tables.LinkColumn("frontend:node-detail", args=[tables.A("pk")], verbose_name=_("Name"))
    status = BadgeColumn(verbose_name=_("Status"))
    device_count = tables.Column(verbose_name=_("Cards"), orderable=True)
    flavor_names = tables.Column(verbose_name=_("Flavors"), orderable=False, empty_values=())
    allocated_millis = tables.Column(verbose_name=_("Allocated (cards)"), orderable=True)
    utilisation = tables.Column(verbose_name=_("Utilisation (live)"), orderable=False, empty_values=())
    last_heartbeat_at = WhenColumn(verbose_name=_("Last heartbeat"), seconds=True)
    agent_version = tables.Column(verbose_name=_("Agent"))

    class Meta(ConsoleTable.Meta):
        model = Node
        fields = (
            "name",
            "status",
            "device_count",
            "flavor_names",
            "allocated_millis",
            "utilisation",
            "last_heartbeat_at",
        )
        sequence = (*fields, "agent_version")
        empty_text = _("No nodes match. Start a node agent with a bootstrap token to add one.")

    def __init__(self, *args, utilisation: dict[int, float] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.utilisation_by_node = utilisation or {}

    def render_status(self, record):
        code, label = node_status_shown(record.status, holds_work=record.holds_work)
        return format_html('<span class="badge {}" data-node-status="{}">{}</span>', code, code, label)

    def value_status(self, record):
        return node_status_shown(record.status, holds_work=record.holds_work)[0]

    def render_utilisation(self, record):
        value = self.utilisation_by_node.get(record.pk)
        return "—" if value is None else f"{value:.0f}%"

    def value_utilisation(self, record):
        value = self.utilisation_by_node.get(record.pk)
        return "" if value is None else f"{value:.1f}"

    def render_flavor_names(self, record):
        return ", ".join(sorted({d.flavor.name for d in record.devices.all() if d.flavor})) or "—"

    def value_flavor_names(self, record):
        return self.render_flavor_names(record)

    def render_allocated_millis(self, value):
        value = value or 0
        return f"{value / 1000:g}"


class AuditTable(ConsoleTable):
    id = tables.LinkColumn("frontend:audit-detail", args=[tables.A("pk")], verbose_name=_("ID"))
    created_at = WhenColumn(verbose_name=_("Time (UTC)"), seconds=True)
    stream = tables.Column(verbose_name=_("Stream"))
    seq = tables.Column(verbose_name=_("Seq"))
    actor_username = tables.Column(verbose_name=_("Actor"), empty_values=())
    actor_role = tables.Column(verbose_name=_("Role"))
    actor_ip = tables.Column(verbose_name=_("IP"))
    action = tables.Column(verbose_name=_("Action"))
    target = tables.Column(verbose_name=_("Target"))
    outcome = BadgeColumn(verbose_name=_("Outcome"))

    class Meta(ConsoleTable.Meta):
        empty_text = _("No audit records match these filters.")
        row_attrs = {"data-outcome": lambda record: record.outcome}

    def render_actor_username(self, value):
        return value or _("system")

    def value_actor_username(self, value):
        return value or "system"

    def render_actor_role(self, value):
        return role_words(value)

    def value_actor_role(self, value):
        return role_words(value)


# The engine's pending reasons (scheduler.core.types.PendingReason) as the short word a queue view shows beside
# the code, like squeue's REASON column; the job's own sentence (pending_message) says the details.
PENDING_REASON_WORDS = {
    PendingReason.AWAITING_APPROVAL: _("approval"),
    PendingReason.INVALID_REQUEST: _("invalid request"),
    PendingReason.NEVER_FITS: _("never fits"),
    PendingReason.NO_QUOTA: _("no quota"),
    PendingReason.QUOTA_EXHAUSTED: _("quota used up"),
    PendingReason.QUOTA_LIMIT: _("quota limit"),
    PendingReason.MAX_RUNNING_JOBS: _("job limit"),
    PendingReason.NO_LENDABLE_CAPACITY: _("nothing to borrow"),
    PendingReason.NO_SUCH_FLAVOR: _("no such cards"),
    PendingReason.NO_MATCHING_NODE: _("no matching node"),
    PendingReason.INSUFFICIENT_CAPACITY: _("resources"),
    PendingReason.INSUFFICIENT_MEMORY: _("card memory"),
    PendingReason.INSUFFICIENT_HOST: _("host CPU or memory"),
    PendingReason.TOPOLOGY: _("topology"),
    PendingReason.GANG: _("gang"),
    PendingReason.WAITING_FOR_PREEMPTION: _("waiting for preemption"),
    PendingReason.BLOCKED_BY_HEAD: _("job ahead"),
    PendingReason.CYCLE_LIMIT: _("not looked at yet"),
    PendingReason.PORTS_EXHAUSTED: _("no free port"),
}


def elapsed_seconds(job, now: datetime) -> float | None:
    """How long the job has run: until now while it runs, its run time once finished; None when it has not
    started (queued jobs, a job admitted whose replicas are not up yet)."""
    if job.started_at is None or job.state in PENDING_JOB_STATES or job.state == JobState.SUBMITTED:
        return None
    if job.state in FINAL_JOB_STATES:
        return (job.finished_at - job.started_at).total_seconds() if job.finished_at else None
    return (now - job.started_at).total_seconds()


def clock_duration(seconds: float) -> str:
    """A duration in units, hours not folded into days: '4m 05s', '27h 03m 10s'. Not squeue's '0:04:05': on a
    page of moments a colon reads as a clock time (tests/frontend/test_date_formats.py)."""
    minutes, secs = divmod(max(0, int(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h {minutes:02d}m {secs:02d}s"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


class SelectColumn(tables.Column):
    """A checkbox per row (``name="select"``, the job id as value) for the bulk actions; a select-all box in
    the header (wired by jobqueue.js). Rows of finished jobs get none: there is nothing to act on."""

    def __init__(self, **kwargs) -> None:
        super().__init__(
            accessor="pk", orderable=False, empty_values=(), exclude_from_export=True, verbose_name="", **kwargs
        )

    @property
    def header(self):
        return format_html('<input type="checkbox" data-select-all aria-label="{}">', _("Select all jobs shown"))

    def render(self, value, record):
        if record.state in FINAL_JOB_STATES:
            return ""
        label = _("Select job %(id)s") % {"id": value}
        return format_html(
            '<input type="checkbox" name="select" value="{}" data-job-select aria-label="{}">', value, label
        )


def _column_name(bound_column) -> str:
    return bound_column.name


class JobTable(ConsoleTable):
    """The jobs list as a queue view (like squeue): state, why a job waits, its place in the queue, when it
    should start, where it runs, how long it has run. Every cell carries ``data-col`` so the column picker can
    hide a column (jobqueue.js)."""

    select = SelectColumn()
    id = tables.Column(verbose_name=_("ID"))
    name = tables.LinkColumn("frontend:job-detail", args=[tables.A("pk")], verbose_name=_("Name"))
    tenant = tables.Column(accessor="tenant__slug", verbose_name=_("Tenant"), order_by="tenant__slug")
    state = BadgeColumn(verbose_name=_("State"))
    reason = tables.Column(accessor="pending_reason_code", verbose_name=_("Reason"), empty_values=())
    position = tables.Column(verbose_name=_("Position"), accessor="pk", empty_values=())
    estimated_start_at = tables.Column(verbose_name=_("Expected start"), empty_values=())
    nodes = tables.Column(verbose_name=_("Nodes"), accessor="pk", empty_values=(), orderable=False)
    elapsed = tables.Column(verbose_name=_("Elapsed"), accessor="started_at", empty_values=(), orderable=False)
    priority_class = tables.Column(verbose_name=_("Priority"))
    request = tables.Column(verbose_name=_("Request"), empty_values=(), orderable=False)
    submitter = tables.Column(accessor="submitter__username", verbose_name=_("Submitter"), default="—")
    submitted_at = WhenColumn(verbose_name=_("Submitted (UTC)"))

    class Meta(ConsoleTable.Meta):
        empty_text = _("No jobs match these filters.")
        attrs = {
            "class": "data",
            "data-queue-table": "",
            "th": {"data-col": _column_name},
            "td": {"data-col": _column_name},
        }
        row_attrs = {"data-job-id": lambda record: record.pk}

    def __init__(
        self,
        *args,
        positions: dict[int, QueuePosition] | None = None,
        now: datetime | None = None,
        selectable: bool = False,
        **kwargs,
    ) -> None:
        """``positions``: the queue positions of pending jobs (``scheduler.selectors.queue_positions``);
        ``selectable``: show the checkboxes of the bulk actions (the user may cancel some jobs)."""
        if not selectable:
            kwargs["exclude"] = (*kwargs.get("exclude", ()), "select")
        super().__init__(*args, **kwargs)
        self.positions = positions or {}
        self.now = now or timezone.now()

    def render_reason(self, record):
        code = self._reason_code(record)
        if code is None:
            return "—"
        word = PENDING_REASON_WORDS.get(code, code) if code else _("new")
        sentence = job_pending_sentence(record)
        if not code:
            return format_html('<span class="reason" title="{}">{}</span>', sentence, word)
        return format_html('<span class="reason" title="{}">{}</span> <code>{}</code>', sentence, word, code)

    def value_reason(self, record):
        return self._reason_code(record) or ""

    @staticmethod
    def _reason_code(record) -> str | None:
        """The pending reason code; '' for a waiting job no cycle has explained yet; None once it left the queue."""
        if record.state == JobState.PENDING_APPROVAL:
            return record.pending_reason_code or PendingReason.AWAITING_APPROVAL
        if record.state == JobState.QUEUED:
            return record.pending_reason_code
        return None

    def render_position(self, record):
        position = self.positions.get(record.pk)
        if position is None:
            return "—"
        title = _("Position %(overall)s in the whole queue, %(tenant)s among its tenant's waiting jobs.") % {
            "overall": position.overall,
            "tenant": position.in_tenant,
        }
        return format_html('<span title="{}">{}</span>', title, position.overall)

    def value_position(self, record):
        position = self.positions.get(record.pk)
        return "" if position is None else position.overall

    def order_position(self, queryset, is_descending):
        """Waiting jobs first, in the order the scheduler serves them; the others after, newest first."""
        waiting_first = Case(When(state__in=PENDING_JOB_STATES, then=Value(0)), default=Value(1))
        keys = [waiting_first.asc(), *queue_order(), F("submitted_at").desc()]
        if is_descending:
            keys = [key.copy().reverse_ordering() for key in keys]
        return queryset.order_by(*keys), True

    def render_nodes(self, record):
        return ", ".join(self._node_names(record)) or "—"

    def value_nodes(self, record):
        return " ".join(self._node_names(record))

    @staticmethod
    def _node_names(record) -> list[str]:
        """Where the job runs now; for a finished job, where it ran. A waiting job (even one preempted
        earlier) has none."""
        allocations = getattr(record, "queue_allocations", None)
        if allocations is None:
            allocations = list(record.allocations.select_related("node"))
        if record.state in ACTIVE_JOB_STATES:
            allocations = [a for a in allocations if a.ended_at is None]
        elif record.state not in FINAL_JOB_STATES:
            return []
        return list(dict.fromkeys(a.node.name for a in allocations))

    def render_elapsed(self, record):
        seconds = elapsed_seconds(record, self.now)
        return "—" if seconds is None else clock_duration(seconds)

    def value_elapsed(self, record):
        seconds = elapsed_seconds(record, self.now)
        return "" if seconds is None else int(seconds)

    def render_estimated_start_at(self, record):
        return job_start_estimate_words(record) or "—"

    def value_estimated_start_at(self, record):
        if not job_start_estimate_words(record):
            return ""
        return record.estimated_start_at.strftime("%Y-%m-%d %H:%M:%S")

    def render_priority_class(self, record):
        return record.get_priority_class_display()

    def value_priority_class(self, record):
        return record.get_priority_class_display()

    def render_request(self, record):
        flavors = "/".join(record.flavors)
        if record.fractional:
            return f"{record.replicas} x {record.millis_per_replica / 1000:.1f} {flavors}"
        return f"{record.replicas} x {record.devices_per_replica} {flavors}"

    def value_request(self, record):
        return self.render_request(record)

    def column_choices(self) -> list[tuple[str, str]]:
        """(name, header) of the columns a user may hide; the checkboxes and the job's name always show."""
        fixed = {"select", "id", "name"}
        return [(column.name, str(column.header)) for column in self.columns if column.name not in fixed]


class YesNoColumn(tables.Column):
    """A boolean in words ("yes"/"no" in the page's language), not a glyph a screen reader cannot say."""

    def render(self, value):
        return _("yes") if value else _("no")

    def value(self, value):
        return "yes" if value else "no"


class UserTable(ConsoleTable):
    """The security admin's account list."""

    username = tables.LinkColumn("frontend:user-detail", args=[tables.A("pk")], verbose_name=_("Username"))
    full_name = tables.Column(verbose_name=_("Name"), empty_values=(), order_by=("last_name", "first_name"))
    email = tables.Column(verbose_name=_("E-mail"))
    platform_role = tables.Column(verbose_name=_("Platform role"))
    is_active = YesNoColumn(verbose_name=_("Active"))
    has_mfa = YesNoColumn(verbose_name=_("Two-factor"))
    is_locked = tables.Column(verbose_name=_("Locked out"))
    last_login = WhenColumn(verbose_name=_("Last sign-in (UTC)"))

    class Meta(ConsoleTable.Meta):
        empty_text = _("No accounts match these filters.")

    def render_full_name(self, record):
        return record.get_full_name() or "—"

    def render_platform_role(self, record):
        return record.get_platform_role_display() or "—"

    def render_is_locked(self, value):
        return format_html('<span class="badge failed">{}</span>', _("locked")) if value else "—"
