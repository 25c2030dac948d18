"""Console tables (django-tables2): sortable columns; filters come from the filtersets, both live in the URL."""

from __future__ import annotations

import django_tables2 as tables
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from frontend.audit_details import role_words
from frontend.datetimes import format_moment
from scheduler.models import Node
from scheduler.selectors import job_start_estimate_words


class BadgeColumn(tables.Column):
    """A choice field shown as a coloured badge; the class is the raw value so CSS can colour it."""

    def render(self, value, record, bound_column):
        display = getattr(record, f"get_{bound_column.accessor}_display", None)
        label = display() if callable(display) else value
        return format_html('<span class="badge {}">{}</span>', value, label)

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


class JobTable(ConsoleTable):
    id = tables.Column(verbose_name=_("ID"))
    name = tables.LinkColumn("frontend:job-detail", args=[tables.A("pk")], verbose_name=_("Name"))
    tenant = tables.Column(accessor="tenant__slug", verbose_name=_("Tenant"), order_by="tenant__slug")
    submitter = tables.Column(accessor="submitter__username", verbose_name=_("Submitter"), default="—")
    state = BadgeColumn(verbose_name=_("State"))
    priority_class = tables.Column(verbose_name=_("Priority"))
    request = tables.Column(verbose_name=_("Request"), empty_values=(), orderable=False)
    submitted_at = WhenColumn(verbose_name=_("Submitted (UTC)"))
    estimated_start_at = tables.Column(verbose_name=_("Expected start"), empty_values=())

    class Meta(ConsoleTable.Meta):
        empty_text = _("No jobs match these filters.")

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
