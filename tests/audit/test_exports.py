"""Export bundles verify offline without Django, and any changed byte makes the verifier fail."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import TestCase
from django.utils import timezone

from audit.bundle_verifier import BundleError, verify_bundle
from audit.exports import build_bundle, trust_root
from audit.models import AuditRecord
from audit.services import audit_record, checkpoint_create
from tests.factories import AuditorFactory, SystemAdminFactory, TenantFactory

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]

RUN_WITHOUT_DJANGO = """
import runpy, sys
sys.argv = ["audit.bundle_verifier", *sys.argv[1:]]
code = 0
try:
    runpy.run_module("audit.bundle_verifier", run_name="__main__")
except SystemExit as exc:
    code = exc.code
print("django imported" if any(m == "django" or m.startswith("django.") for m in sys.modules) else "no django")
sys.exit(code)
"""


def populate():
    tenant = TenantFactory()
    admin = SystemAdminFactory()
    for index in range(4):
        audit_record(
            action="quota.update",
            actor=admin,
            tenant=tenant,
            target=f"quota:{index}",
            details={"before": index, "after": index + 1},
        )
    audit_record(action="node.cordon", actor=admin, target="node:1", details={"reason": 'maintenance, "quoted"'})
    return tenant


def export(tmp_path, **kwargs) -> Path:
    now = timezone.now()
    with TestCase.captureOnCommitCallbacks(execute=True):
        body, _manifest = build_bundle(
            actor=AuditorFactory(), start=now - dt.timedelta(hours=1), end=now + dt.timedelta(hours=1), **kwargs
        )
    path = tmp_path / "bundle.zip"
    path.write_bytes(body)
    return path


def rewrite(path: Path, name: str, change) -> Path:
    """A copy of the bundle with member ``name`` replaced by ``change(bytes)``."""
    with zipfile.ZipFile(path) as source:
        members = {n: source.read(n) for n in source.namelist()}
    members[name] = change(members[name])
    out = path.with_name(f"tampered-{name}.zip")
    with zipfile.ZipFile(out, "w") as target:
        for member, body in members.items():
            target.writestr(member, body)
    return out


def flip(position: int):
    def change(body: bytes) -> bytes:
        data = bytearray(body)
        data[position % len(data)] ^= 0x01
        return bytes(data)

    return change


def run_verifier(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO", "GPUPOOL"))}
    return subprocess.run(
        [sys.executable, "-c", RUN_WITHOUT_DJANGO, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_bundle_verifies_offline_without_django(tmp_path):
    populate()
    path = export(tmp_path)
    result = run_verifier(str(path), "--trust-root", trust_root())
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("OK: ") and "no django" in result.stdout


def test_verifier_fails_without_a_pinned_key_unless_told_unpinned(tmp_path):
    populate()
    path = export(tmp_path)
    result = run_verifier(str(path))
    assert result.returncode == 1
    assert result.stdout.startswith("FAILED: the trust root is not pinned") and trust_root() in result.stdout
    result = run_verifier(str(path), "--unpinned")
    assert result.returncode == 0 and "UNPINNED" in result.stdout


def test_verifier_fails_on_a_changed_byte_and_exits_nonzero(tmp_path):
    populate()
    tampered = rewrite(export(tmp_path), "records.csv", flip(40))
    result = run_verifier(str(tampered))
    assert result.returncode == 1 and result.stdout.startswith("FAILED")


MEMBERS = [
    "records.jsonl",
    "records.csv",
    "manifest.json",
    "manifest.sig",
    "checkpoints.json",
    "trust.json",
    "witness.json",
    "datakeys.json",
    "public_key.pem",
]


@pytest.mark.parametrize("name", MEMBERS)
def test_any_changed_byte_in_any_file_fails_verification(tmp_path, name):
    populate()
    path = export(tmp_path)
    size = len(zipfile.ZipFile(path).read(name))
    positions = sorted({0, 1, size // 3, size // 2, (2 * size) // 3, size - 2, size - 1})
    for position in positions:
        with pytest.raises(BundleError):
            verify_bundle(str(rewrite(path, name, flip(position))))


def test_every_byte_of_one_record_line_is_covered(tmp_path):
    populate()
    path = export(tmp_path)
    first_line = zipfile.ZipFile(path).read("records.jsonl").split(b"\n")[0]
    for position in range(0, len(first_line), 7):
        with pytest.raises(BundleError):
            verify_bundle(str(rewrite(path, "records.jsonl", flip(position))))


def test_a_consistently_recomputed_bundle_still_fails_on_its_chain(tmp_path):
    """Edit a record and fix the manifest hashes and signature with the attacker's own key: the key is not in the
    trust root's chain, whatever the bundle says."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from audit.signing import Ed25519Signer

    populate()
    path = export(tmp_path)
    with zipfile.ZipFile(path) as source:
        members = {n: source.read(n) for n in source.namelist()}
    lines = members["records.jsonl"].decode().splitlines()
    record = json.loads(lines[0])
    record["header"]["target"] = "quota:evil"
    lines[0] = json.dumps(record, sort_keys=True, ensure_ascii=False)
    members["records.jsonl"] = ("\n".join(lines) + "\n").encode()
    attacker = Ed25519Signer(Ed25519PrivateKey.generate().private_bytes_raw())
    manifest = json.loads(members["manifest.json"])
    members["public_key.pem"] = attacker.public_key_pem().encode()
    for name in ("records.jsonl", "public_key.pem"):
        manifest["files"][name] = hashlib.sha256(members[name]).hexdigest()
    manifest["signing_key_id"] = attacker.key_id
    members["manifest.json"] = json.dumps(manifest, indent=1, sort_keys=True).encode()
    members["manifest.sig"] = (attacker.sign(members["manifest.json"]) + "\n").encode()
    forged = tmp_path / "forged.zip"
    with zipfile.ZipFile(forged, "w") as target:
        for member, body in members.items():
            target.writestr(member, body)
    with pytest.raises(BundleError, match="not in the trust root's key chain"):
        verify_bundle(str(forged))
    with pytest.raises(BundleError, match="not in the trust root's key chain"):
        verify_bundle(str(forged), trust_root=trust_root())


def test_tenant_export_holds_only_that_tenants_stream(tmp_path):
    tenant = populate()
    audit_record(action="job.submit", actor=None, tenant=TenantFactory(), target="job:other")
    path = export(tmp_path, tenant_id=tenant.pk)
    summary = verify_bundle(str(path))
    assert summary["streams"] == 1 and summary["records"] == 4
    streams = {
        json.loads(line)["header"]["stream"] for line in zipfile.ZipFile(path).read("records.jsonl").splitlines()
    }
    assert streams == {f"tenant:{tenant.pk}"}


def test_export_of_a_later_range_is_anchored_by_the_previous_checkpoint(tmp_path):
    tenant = TenantFactory()
    for index in range(3):
        audit_record(action="job.submit", actor=None, tenant=tenant, target=f"job:{index}")
    stream = f"tenant:{tenant.pk}"
    checkpoint_create(stream=stream)
    later = timezone.now()
    for index in range(3, 6):
        audit_record(action="job.submit", actor=None, tenant=tenant, target=f"job:{index}")
    with TestCase.captureOnCommitCallbacks(execute=True):
        body, manifest = build_bundle(actor=None, start=later, end=later + dt.timedelta(hours=1), tenant_id=tenant.pk)
    assert manifest["streams"][stream] == {"from_seq": 4, "to_seq": 6, "records": 3, "anchor_seq": 3}
    path = tmp_path / "later.zip"
    path.write_bytes(body)
    assert verify_bundle(str(path))["records"] == 3


def test_export_command_writes_a_bundle_and_is_audited(tmp_path, capsys):
    populate()
    out = tmp_path / "cmd.zip"
    today = timezone.now().date().isoformat()
    call_command("audit_export", "--from", today, "--to", today, "-o", str(out))
    assert "python -m audit.bundle_verifier" in capsys.readouterr().out
    assert verify_bundle(str(out))["records"] >= 5
    assert AuditRecord.objects.filter(action="audit.export").exists()


def test_a_truncated_zip_fails_cleanly(tmp_path):
    populate()
    path = export(tmp_path)
    broken = tmp_path / "broken.zip"
    broken.write_bytes(path.read_bytes()[:-30])
    with pytest.raises(BundleError):
        verify_bundle(str(broken))
