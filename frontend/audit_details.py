"""An audit record's opened details as an auditor reads them: the change as a table of before and after side by
side (changed keys marked), the other keys as a definition list, values in words (roles by name, yes/no, lists
joined), and the JSON only where the details are not a dict (a shredded or broken seal says so in words)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django.utils.translation import gettext as _

from audit.services import SEAL_BROKEN, SHREDDED
from tenants.models import ApprovalStepRole, MembershipRole, PlatformRole

#: Keys whose values are role codes (platform, membership or approver roles) and are shown by their names.
ROLE_KEYS = frozenset({"role", "platform_role", "actor_role", "awaiting_role", "chain", "roles"})
#: Details keys that hold the state before and after the change.
BEFORE, AFTER = "before", "after"


@dataclass(frozen=True)
class ChangeRow:
    key: str
    before: str
    after: str
    changed: bool


@dataclass
class AuditDetails:
    """What the record page shows: ``changes`` (before/after rows), ``facts`` (other keys, label and value) and,
    for details that are not a dict, ``text`` (the JSON or the stored sentence)."""

    changes: list[ChangeRow] = field(default_factory=list)
    has_before: bool = False
    has_after: bool = False
    facts: list[tuple[str, str]] = field(default_factory=list)
    text: str = ""
    # Why the details cannot be read (crypto-shredded, seal broken), in words.
    unreadable: str = ""

    @property
    def changed_count(self) -> int:
        return sum(1 for row in self.changes if row.changed)


def role_words(value: str) -> str:
    """A role code in words: ``system_admin`` → "system admin", ``parent_tenant_admin`` → "tenant admin of the
    parent tenant"; anything else unchanged (from the models' choices, so the console's language applies)."""
    if not value:
        return ""
    for choices in (PlatformRole, ApprovalStepRole, MembershipRole):
        if value in choices.values:
            return str(choices(value).label)
    return value


def _is_scalar(value: Any) -> bool:
    return isinstance(value, str | int | float) and not isinstance(value, bool)


def value_words(value: Any, *, key: str = "") -> str:
    """One value as text: "—" for none, yes/no, roles by name, scalar lists joined, anything deeper as JSON."""
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return _("yes") if value else _("no")
    scalars = isinstance(value, list) and all(_is_scalar(item) for item in value)
    if key in ROLE_KEYS and (isinstance(value, str) or scalars):
        if isinstance(value, str):
            return role_words(value)
        return (" → " if key == "chain" else ", ").join(role_words(str(item)) for item in value)
    if scalars:
        return ", ".join(str(item) for item in value) if value else "—"
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    return str(value)


def audit_details(details: dict | str | None) -> AuditDetails:
    """Lay out ``details`` (``audit.services.record_details``) for the record page."""
    if details == SHREDDED:
        return AuditDetails(
            unreadable=_("Shredded: the data key of this record's tenant was destroyed, so its details cannot be read.")
        )
    if details == SEAL_BROKEN:
        return AuditDetails(
            unreadable=_("Seal broken: the stored details do not decrypt under their key; the record was altered.")
        )
    if not isinstance(details, dict):
        if details is None:
            return AuditDetails()
        return AuditDetails(text=details if isinstance(details, str) else json.dumps(details, indent=2))
    view = AuditDetails()
    before, after = details.get(BEFORE), details.get(AFTER)
    tabular = isinstance(before, dict | type(None)) and isinstance(after, dict | type(None)) and (before or after)
    if tabular:
        before, after = before or {}, after or {}
        view.has_before, view.has_after = bool(before), bool(after)
        keys = list(before) + [key for key in after if key not in before]
        for key in keys:
            old, new = before.get(key), after.get(key)
            changed = view.has_before and view.has_after and old != new
            view.changes.append(
                ChangeRow(
                    key=key,
                    before=value_words(old, key=key) if key in before else "—",
                    after=value_words(new, key=key) if key in after else "—",
                    changed=changed,
                )
            )
    for key, value in details.items():
        if tabular and key in (BEFORE, AFTER):
            continue
        view.facts.append((key, value_words(value, key=key)))
    return view
