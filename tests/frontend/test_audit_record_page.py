"""The auditor reads a record's details as tables (before and after side by side, the changed fields marked), roles
by their names, and picks a tenant by name — never a Python dict, a role code or a tenant id to type."""

from __future__ import annotations

import html
import re

import pytest

from audit.models import AuditRecord
from audit.services import SHREDDED, audit_record
from frontend.audit_details import audit_details
from scheduler.models import Job
from scheduler.services.jobs import job_submit
from tenants.models import MembershipRole, PlatformRole
from tenants.services.identity import user_set_platform_role
from tenants.services.quotas import quota_set
from tests.frontend.factories import make_flavor, make_member, make_tenant, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def auditor_client(client):
    client.force_login(make_user("olga", platform_role=PlatformRole.AUDITOR))
    return client


def page_text(response) -> str:
    return html.unescape(response.content.decode())


def test_a_quota_change_reads_as_before_and_after_with_the_changed_field_marked(auditor_client):
    flavor = make_flavor()
    team = make_tenant("vision")
    quota_set(actor=None, tenant=team, flavor=flavor, values={"guaranteed_millis": 1000, "limit_millis": 4000})
    quota_set(actor=None, tenant=team, flavor=flavor, values={"guaranteed_millis": 2000, "limit_millis": 4000})
    record = AuditRecord.objects.filter(action="quota.update").order_by("-id").first()
    page = page_text(auditor_client.get(f"/console/audit/{record.pk}/"))

    table = page.split('data-testid="audit-change">', 1)[1].split("</table>", 1)[0]
    assert re.search(r"<th scope=\"col\">Before</th><th scope=\"col\">After</th>", table)
    changed = re.search(
        r'<tr class="changed" data-changed><th scope="row"><code>guaranteed_millis</code>.*?</tr>', table
    )
    assert changed and "<td>1000</td><td>2000</td>" in changed[0] and "changed" in changed[0]
    unchanged = re.search(r"<tr><th scope=\"row\"><code>limit_millis</code>.*?</tr>", table)
    assert unchanged and "<td>4000</td><td>4000</td>" in unchanged[0]
    assert "1 field changed." in page
    assert "{'" not in page and "'before'" not in page  # no Python dict
    assert f"Vision (vision, id {team.pk})" in page  # the tenant by name, not a bare id


def test_roles_read_as_words_in_the_record_and_the_trail(auditor_client):
    security = make_user("sam", platform_role=PlatformRole.SECURITY_ADMIN)
    target = make_user("tom")
    user_set_platform_role(actor=security, user=target, platform_role=PlatformRole.SYSTEM_ADMIN)
    record = AuditRecord.objects.filter(action__startswith="user.", actor_username="sam").order_by("-id").first()
    page = page_text(auditor_client.get(f"/console/audit/{record.pk}/"))
    assert "sam (security admin)" in page
    assert "<td>system admin</td>" in page
    assert "security_admin" not in page and "system_admin" not in page

    trail = page_text(auditor_client.get("/console/audit/?actor=sam"))
    assert "security admin" in trail and "security_admin" not in trail
    assert "security admin" in auditor_client.get("/console/audit/?actor=sam&export=csv").content.decode()


def test_other_keys_are_a_definition_list_and_unreadable_details_say_why():
    view = audit_details(
        {
            "chain": ["parent_tenant_admin", "system_admin"],
            "final": True,
            "escalations": [{"role": "x", "reason": "y"}],
            "after": {"role": MembershipRole.TENANT_ADMIN},
        }
    )
    facts = dict(view.facts)
    assert facts["chain"] == "tenant admin of the parent tenant → system admin"
    assert facts["final"] == "yes"
    assert facts["escalations"] == '[{"reason": "y", "role": "x"}]'
    assert [(row.key, row.before, row.after, row.changed) for row in view.changes] == [
        ("role", "—", "tenant admin", False)
    ]
    assert not view.has_before and view.has_after
    shredded = audit_details(SHREDDED)
    assert "data key" in shredded.unreadable and not shredded.text


def test_the_auditor_picks_a_tenant_by_name_to_filter_and_export(auditor_client):
    company = make_tenant("acme")
    research = make_tenant("research", parent=company)
    audit_record(action="console.test", actor=None, tenant=research, target="in:research")
    audit_record(action="console.test", actor=None, tenant=company, target="in:acme")
    page = page_text(auditor_client.get("/console/audit/"))
    for form in ("filters", "export"):
        assert f'<option value="{research.pk}">Acme / Research (research)</option>' in page, form
    assert page.count('<select name="tenant"') == 2
    filtered = page_text(auditor_client.get(f"/console/audit/?tenant={research.pk}"))
    assert "in:research" in filtered and "in:acme" not in filtered


def test_a_member_filters_jobs_by_a_tenant_picked_by_name(client):
    make_flavor()
    company = make_tenant("acme")
    vision = make_tenant("vision", parent=company)
    nlp = make_tenant("nlp", parent=company)
    alice = make_member(company, role=MembershipRole.TENANT_ADMIN, username="alice")
    for tenant in (vision, nlp):
        job_submit(
            actor=alice,
            spec={
                "name": f"job-{tenant.slug}",
                "tenant": tenant.slug,
                "resources": {"flavors": ["nvidia-h100-80g"], "gpus": 1},
                "command": ["x"],
            },
        )
    client.force_login(alice)
    page = page_text(client.get("/console/jobs/"))
    assert '<option value="vision">Acme / Vision (vision)</option>' in page
    filtered = page_text(client.get("/console/jobs/?tenant=vision"))
    assert "job-vision" in filtered and "job-nlp" not in filtered
    assert Job.objects.count() == 2
