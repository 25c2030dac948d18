"""Console forms. They check the shape of the input and build the dict a service takes; rules stay in services."""

from __future__ import annotations

import datetime
import json
import shlex
from decimal import Decimal

from django import forms
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from frontend.service_text import localize
from kernel import request_limits
from scheduler.jobspec import EXAMPLE_COMMAND, MAX_FLAVORS
from scheduler.models import JobKind, PriorityClass

FRACTION_CHOICES = [(str(m), f"{m / 1000:.1f}") for m in range(100, 1000, 100)]


class DateInput(forms.DateInput):
    """An ``<input type="date">``. Its value must be ISO (``2026-11-27``) whatever the language: browsers drop
    a localised value such as Chinese ``2026/11/27``, and the default range with it."""

    input_type = "date"

    def __init__(self, attrs: dict | None = None, format: str | None = None) -> None:
        super().__init__(attrs=attrs, format=format or "%Y-%m-%d")


#: The flavor choice that lets the scheduler pick among all of them (no flavor is named like this: names are slugs).
ANY_FLAVOR = "*"


class JobSubmitForm(forms.Form):
    """The fields of a job spec most people need; anything else goes in the pasted JSON."""

    tenant = forms.ChoiceField(label=_("Tenant"))
    name = forms.CharField(label=_("Name"), max_length=128)
    kind = forms.ChoiceField(label=_("Kind"), choices=JobKind.choices, initial=JobKind.TRAINING)
    priority_class = forms.ChoiceField(
        label=_("Priority"),
        choices=[(c.name.lower(), c.label) for c in PriorityClass],
        initial="normal",
    )
    preemptible = forms.BooleanField(
        label=_("Preemptible (may be paused for more urgent work)"), required=False, initial=True
    )
    replicas = forms.IntegerField(label=_("Replicas (gang size)"), min_value=1, max_value=256, initial=1)
    flavor = forms.ChoiceField(label=_("Flavor"))
    size = forms.ChoiceField(
        label=_("Per replica"),
        choices=[("whole", _("whole cards")), ("fraction", _("a fraction of one card"))],
        initial="whole",
        widget=forms.RadioSelect,
    )
    gpus = forms.IntegerField(label=_("Cards per replica"), min_value=1, max_value=64, initial=1, required=False)
    millis = forms.ChoiceField(label=_("Share of one card"), choices=FRACTION_CHOICES, initial="500", required=False)
    memory_gib = forms.FloatField(label=_("Device memory (GiB, for a fraction)"), min_value=0.1, required=False)
    command = forms.CharField(
        label=_("Command"),
        help_text=format_lazy(
            "{} {}",
            _(
                "As you would type it in a shell; it starts in an empty directory of its own on the node. This one "
                "prints a minute of progress:"
            ),
            EXAMPLE_COMMAND,
        ),
        max_length=8000,
        widget=forms.TextInput(attrs={"placeholder": EXAMPLE_COMMAND, "spellcheck": "false"}),
    )
    max_runtime_s = forms.IntegerField(label=_("Maximum runtime (seconds)"), min_value=1, required=False)
    checkpoint_dir = forms.CharField(label=_("Checkpoint directory"), max_length=1024, required=False)

    def __init__(
        self, *args, tenants: list[tuple[str, str]], flavors: list[str], flavor_labels: dict | None = None, **kwargs
    ) -> None:
        super().__init__(*args, **kwargs)
        self.fields["tenant"].choices = tenants
        labels = flavor_labels or {}
        self.flavors = list(flavors)
        choices = [(f, labels.get(f, f)) for f in flavors]
        if 1 < len(flavors) <= MAX_FLAVORS:
            # The spec's resources.any_flavor: every flavor is an alternative, the scheduler keeps the best fit.
            choices.append(
                (ANY_FLAVOR, _("Any of them (the scheduler picks where the job borrows and strands the least)"))
            )
        self.fields["flavor"].choices = choices

    def clean(self) -> dict:
        data = super().clean()
        if data.get("size") == "fraction":
            if not data.get("memory_gib"):
                self.add_error("memory_gib", _("Say how much device memory a fraction of a card needs."))
        elif not data.get("gpus"):
            self.add_error("gpus", _("Say how many whole cards each replica needs."))
        command = data.get("command")
        if command:
            try:
                data["argv"] = shlex.split(command)
            except ValueError as exc:
                self.add_error("command", _("The command cannot be split into arguments: %(error)s") % {"error": exc})
        return data

    def spec(self) -> dict:
        data = self.cleaned_data
        if data["flavor"] == ANY_FLAVOR:
            resources: dict = {"flavors": self.flavors, "any_flavor": True}
        else:
            resources = {"flavors": [data["flavor"]]}
        if data["size"] == "fraction":
            resources["millis"] = int(data["millis"])
            resources["memory_mib"] = round(data["memory_gib"] * 1024)
        else:
            resources["gpus"] = data["gpus"]
        spec = {
            "name": data["name"],
            "tenant": data["tenant"],
            "kind": data["kind"],
            "priority_class": data["priority_class"],
            "preemptible": bool(data["preemptible"]),
            "replicas": data["replicas"],
            "resources": resources,
            "command": data["argv"],
        }
        if data.get("max_runtime_s"):
            spec["max_runtime_s"] = data["max_runtime_s"]
        if data.get("checkpoint_dir"):
            spec["checkpoint_dir"] = data["checkpoint_dir"]
        return spec


class JobJsonForm(forms.Form):
    spec_json = forms.CharField(
        label=_("Job spec (JSON)"),
        widget=forms.Textarea(attrs={"rows": 14, "spellcheck": "false"}),
        help_text=_("The same JSON the API and the CLI take."),
    )

    def clean_spec_json(self) -> dict:
        try:
            # The API's limits: no NUL character, nesting within GPUPOOL_MAX_JSON_DEPTH.
            value = request_limits.loads_checked(self.cleaned_data["spec_json"], where="the job spec")
        except request_limits.BadInput as exc:
            raise forms.ValidationError(localize(exc.detail)) from None
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(
                _("This is not valid JSON (line %(line)s, column %(col)s): %(msg)s")
                % {"line": exc.lineno, "col": exc.colno, "msg": exc.msg}
            ) from None
        if not isinstance(value, dict):
            raise forms.ValidationError(_("A job spec is a JSON object: {...}."))
        return value


class CancelForm(forms.Form):
    reason = forms.CharField(label=_("Reason (optional)"), max_length=300, required=False)


class AuditExportForm(forms.Form):
    """The range (and optionally one tenant's stream) of a signed audit export bundle."""

    start = forms.DateField(label=_("From (date, UTC)"), widget=DateInput())
    end = forms.DateField(label=_("To (date, UTC, inclusive)"), widget=DateInput(), required=False)
    tenant = forms.ChoiceField(label=_("Tenant"), required=False)

    def __init__(self, *args, tenants: list[tuple[str, str]] = (), **kwargs) -> None:
        """``tenants``: (id, name) of the tenants whose stream may be exported alone."""
        super().__init__(*args, **kwargs)
        self.fields["tenant"].choices = [("", _("every stream")), *tenants]

    def clean_tenant(self) -> int | None:
        value = self.cleaned_data.get("tenant")
        return int(value) if value else None

    def clean(self) -> dict:
        data = super().clean()
        start, end = data.get("start"), data.get("end")
        if start and end and end < start:
            self.add_error("end", _("'To' must not be before 'From'."))
        return data

    def range(self) -> tuple[datetime.datetime, datetime.datetime]:
        """[start, end) in UTC: whole days, the end day included."""
        start = self.cleaned_data["start"]
        end = self.cleaned_data.get("end") or datetime.datetime.now(datetime.UTC).date()
        midnight = datetime.time(0, 0, tzinfo=datetime.UTC)
        return (
            datetime.datetime.combine(start, midnight),
            datetime.datetime.combine(end + datetime.timedelta(days=1), midnight),
        )


def _millis(cards: Decimal | None) -> int | None:
    return None if cards is None else int(cards * 1000)


class QuotaChangeForm(forms.Form):
    """A quota change request in cards (0.1 steps); the service takes millis and re-checks the whole tree."""

    flavor = forms.ChoiceField(label=_("Flavor"))
    guaranteed_cards = forms.DecimalField(
        label=_("Guaranteed (cards)"), min_value=0, max_digits=8, decimal_places=1, initial=0
    )
    limit_cards = forms.DecimalField(
        label=_("Limit incl. borrowing (cards, empty = no limit)"),
        min_value=0,
        max_digits=8,
        decimal_places=1,
        required=False,
    )
    lending_limit_cards = forms.DecimalField(
        label=_("Lendable to siblings (cards, empty = all idle)"),
        min_value=0,
        max_digits=8,
        decimal_places=1,
        required=False,
    )
    guaranteed_memory_gib = forms.IntegerField(label=_("Guaranteed device memory (GiB)"), min_value=0, initial=0)
    max_running_jobs = forms.IntegerField(
        label=_("Maximum running jobs (empty = no limit)"), min_value=1, required=False
    )
    reason = forms.CharField(
        label=_("Reason"), widget=forms.Textarea(attrs={"rows": 3}), max_length=2000, required=False
    )

    # Form field -> the quota value it edits.
    QUOTA_FIELD_OF = {
        "guaranteed_cards": "guaranteed_millis",
        "limit_cards": "limit_millis",
        "lending_limit_cards": "lending_limit_millis",
        "guaranteed_memory_gib": "guaranteed_memory_mib",
        "max_running_jobs": "max_running_jobs",
    }

    def __init__(self, *args, flavors: list[str], current: dict | None = None, **kwargs) -> None:
        """``current``: the tenant's quota values for the chosen flavor (millis/MiB), shown as the starting point
        so that changing one figure leaves the others as they are."""
        if current is not None:
            kwargs["initial"] = {**self.initial_from(current), **kwargs.get("initial", {})}
        super().__init__(*args, **kwargs)
        self.fields["flavor"].choices = [(f, f) for f in flavors]
        self.fields["flavor"].widget = forms.HiddenInput()

    @staticmethod
    def initial_from(current: dict) -> dict:
        def cards(millis: int | None) -> Decimal | None:
            return None if millis is None else Decimal(millis) / 1000

        return {
            "guaranteed_cards": cards(current.get("guaranteed_millis")) or 0,
            "limit_cards": cards(current.get("limit_millis")),
            "lending_limit_cards": cards(current.get("lending_limit_millis")),
            "guaranteed_memory_gib": (current.get("guaranteed_memory_mib") or 0) // 1024,
            "max_running_jobs": current.get("max_running_jobs"),
        }

    def values(self) -> dict:
        data = self.cleaned_data
        return {
            "guaranteed_millis": _millis(data["guaranteed_cards"]),
            "limit_millis": _millis(data.get("limit_cards")),
            "lending_limit_millis": _millis(data.get("lending_limit_cards")),
            "guaranteed_memory_mib": data["guaranteed_memory_gib"] * 1024,
            "max_running_jobs": data.get("max_running_jobs"),
        }

    def changed_values(self) -> dict:
        """Only the quota values the person changed from the ones shown (the service keeps the rest)."""
        values = self.values()
        changed = {self.QUOTA_FIELD_OF[name] for name in self.changed_data if name in self.QUOTA_FIELD_OF}
        return {key: value for key, value in values.items() if key in changed}


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(
        choices=[("approve", _("Approve")), ("reject", _("Reject")), ("request_changes", _("Request changes"))]
    )
    comment = forms.CharField(
        label=_("Comment"), widget=forms.Textarea(attrs={"rows": 3}), max_length=2000, required=False
    )

    def clean(self) -> dict:
        data = super().clean()
        if data.get("decision") in ("reject", "request_changes") and not data.get("comment"):
            self.add_error("comment", _("Say why, so the requester knows what to change."))
        return data


class UsageReportForm(forms.Form):
    """The range and grouping of a showback report; read from the query string so a report is a link."""

    start = forms.DateField(label=_("From (date, UTC)"), widget=DateInput())
    end = forms.DateField(label=_("To (date, UTC, inclusive)"), widget=DateInput())
    period = forms.ChoiceField(
        label=_("Period"), choices=[("day", _("day")), ("week", _("week")), ("month", _("month"))], initial="day"
    )
    tenant = forms.ChoiceField(label=_("Tenant"), required=False)

    def __init__(self, *args, tenants: list[tuple[str, str]], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["tenant"].choices = [("", _("all I may see")), *tenants]

    def clean(self) -> dict:
        data = super().clean()
        if data.get("start") and data.get("end") and data["end"] < data["start"]:
            self.add_error("end", _("'To' must not be before 'From'."))
        return data

    def range(self) -> tuple[datetime.datetime, datetime.datetime]:
        midnight = datetime.time(0, 0, tzinfo=datetime.UTC)
        return (
            datetime.datetime.combine(self.cleaned_data["start"], midnight),
            datetime.datetime.combine(self.cleaned_data["end"] + datetime.timedelta(days=1), midnight),
        )


class WhatIfForm(forms.Form):
    """The window and the proposed settings of a what-if; read from the query string so a comparison is a link."""

    days = forms.IntegerField(label=_("Replay the last (days)"), min_value=1, max_value=366, initial=30)
    settings = forms.CharField(
        label=_("Proposed settings, one per line"),
        widget=forms.Textarea(attrs={"rows": 4, "placeholder": "preemption=false\nmin_runtime_before_preempt_s=900"}),
        max_length=2000,
    )

    def clean_settings(self) -> dict[str, str]:
        """``name=value`` lines → a dict; the service checks the names and values (and lists the valid ones)."""
        changes: dict[str, str] = {}
        for line in self.cleaned_data["settings"].splitlines():
            if not line.strip():
                continue
            name, sep, value = line.partition("=")
            if not sep or not name.strip():
                raise forms.ValidationError(_("Write each setting as name=value, e.g. preemption=false."))
            changes[name.strip()] = value.strip()
        if not changes:
            raise forms.ValidationError(_("Say what to change, e.g. preemption=false."))
        return changes
