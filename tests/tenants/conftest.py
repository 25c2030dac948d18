"""A small tenant world shared by the tenants tests: two companies, users in every role."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from rest_framework.test import APIClient

from tenants.models import MembershipRole, TenantKind, User
from tests.factories import (
    AuditorFactory,
    MembershipFactory,
    SecurityAdminFactory,
    SystemAdminFactory,
    TenantFactory,
    UserFactory,
)

ROLES = ["member", "viewer", "tenant_admin", "system_admin", "security_admin", "auditor"]


@dataclass
class World:
    acme: object
    research: object
    vision: object
    nlp: object
    globex: object
    globex_team: object
    users: dict[str, User]

    def client(self, role: str | None) -> APIClient:
        client = APIClient()
        if role is not None:
            client.force_authenticate(self.users[role])
        return client


@pytest.fixture
def world(db) -> World:
    acme = TenantFactory(name="ACME", slug="acme", kind=TenantKind.COMPANY)
    research = TenantFactory(name="Research", slug="acme-research", kind=TenantKind.DEPARTMENT, parent=acme)
    vision = TenantFactory(name="Vision", slug="acme-vision", parent=research)
    nlp = TenantFactory(name="NLP", slug="acme-nlp", parent=research)
    globex = TenantFactory(name="Globex", slug="globex", kind=TenantKind.COMPANY)
    globex_team = TenantFactory(name="Globex Team", slug="globex-team", parent=globex)
    users = {
        "member": UserFactory(username="vmember"),
        "viewer": UserFactory(username="vviewer"),
        "tenant_admin": UserFactory(username="radmin"),
        "system_admin": SystemAdminFactory(username="sys"),
        "security_admin": SecurityAdminFactory(username="sec"),
        "auditor": AuditorFactory(username="aud"),
        "outsider": UserFactory(username="gmember"),
    }
    MembershipFactory(user=users["member"], tenant=vision, role=MembershipRole.MEMBER)
    MembershipFactory(user=users["viewer"], tenant=vision, role=MembershipRole.VIEWER)
    MembershipFactory(user=users["tenant_admin"], tenant=research, role=MembershipRole.TENANT_ADMIN)
    MembershipFactory(user=users["outsider"], tenant=globex_team, role=MembershipRole.MEMBER)
    return World(acme, research, vision, nlp, globex, globex_team, users)


def audited(action: str, **filters) -> list[dict]:
    """The events recorded with ``action`` (one per event, whatever streams it landed in), oldest first, each
    as its header fields plus the opened ``details``."""
    from audit.models import AuditRecord
    from audit.services import record_details

    seen: set[str] = set()
    events = []
    for record in AuditRecord.objects.filter(action=action, **filters).order_by("id"):
        if record.event_id in seen:
            continue
        seen.add(record.event_id)
        events.append(
            {
                "actor_username": record.actor_username,
                "target": record.target,
                "outcome": record.outcome,
                "tenant_id": record.tenant_id,
                "details": record_details(record),
            }
        )
    return events
