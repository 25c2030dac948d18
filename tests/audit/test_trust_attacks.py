"""The red team of issue 32: attacks on a production-configured database, each run as the role that can do it,
and each checked with every verifier the product offers — ``audit_verify`` (online), the scheduled integrity
check, and export + ``python -m audit.bundle_verifier --trust-root`` (offline) — or refused outright.

The trust root is pinned before each attack, as the auditor pinned it at install (``GPUPOOL_AUDIT_TRUST_ROOT``,
taken from the witness, never from the database).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction
from django.test import TestCase
from django.utils import timezone

from audit import chain, transparency, witness
from audit.bundle_verifier import BundleError, verify_bundle
from audit.exports import build_bundle, trust_root
from audit.integrity import latest_failure, run_integrity_check
from audit.models import AuditRecord, ChainHead, Checkpoint, DataKey
from audit.services import audit_record, checkpoint_all, legal_hold_place, record_header
from audit.signing import Ed25519Signer, get_signer
from audit.trail_verifier import verify_trail
from kernel.api import DomainError
from tests.audit.helpers import raw, row
from tests.factories import AuditorFactory, TenantFactory, UserFactory

pytestmark = [pytest.mark.django_db, pytest.mark.database_owner]


# --- the set-up an auditor has ------------------------------------------------------------------------------


def sealed() -> None:
    """What beat's ``audit.checkpoint`` does every second: sign every changed head and have the witness cosign."""
    with TestCase.captureOnCommitCallbacks(execute=True):
        checkpoint_all()


@pytest.fixture
def pinned(settings) -> str:
    """A tenant with history, sealed and witnessed, and the trust root pinned as at install."""
    sealed_tenant_records(TenantFactory(), 3)
    fingerprint = trust_root()
    settings.GPUPOOL_AUDIT_TRUST_ROOT = fingerprint
    return fingerprint


def sealed_tenant_records(tenant, count: int) -> str:
    member = UserFactory()
    for index in range(count):
        audit_record(action="job.submit", actor=member, tenant=tenant, target=f"job:{index}", details={"i": index})
    sealed()
    return f"tenant:{tenant.pk}"


@pytest.fixture
def roles(postgres) -> tuple[str, str]:
    base = connection.settings_dict["NAME"][:40]
    portal, admin = f"{base}_portal", f"{base}_audit_admin"
    call_command("db_roles", "--portal-role", portal, "--admin-role", admin, verbosity=0)
    return portal, admin


@contextmanager
def as_role(role: str) -> Iterator:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL ROLE {connection.ops.quote_name(role)}")
        yield cursor
        cursor.execute("RESET ROLE")


def online(expect: str) -> None:
    report = verify_trail(record_result=False)
    messages = [f"{f.kind.upper()}: {f.stream}: {f.message}" for f in report.findings]
    assert not report.ok and any(expect in m for m in messages), messages


def scheduled(expect: str) -> None:
    check = run_integrity_check(full=True)
    assert not check.ok and any(expect in f["message"] for f in check.findings), check.findings
    assert AuditRecord.objects.filter(action="audit.integrity_check", outcome="failure").exists()
    assert latest_failure() is not None  # the console's banner


def offline(tmp_path, fingerprint: str, expect: str | None = None) -> None:
    """Export and verify against the pinned trust root: the export refuses, or the verifier fails."""
    now = timezone.now()
    try:
        with TestCase.captureOnCommitCallbacks(execute=True):
            body, _manifest = build_bundle(actor=AuditorFactory(), start=now - dt.timedelta(hours=1), end=now)
    except DomainError as refused:
        assert expect is None or expect in refused.message, refused.message
        return
    path = tmp_path / "bundle.zip"
    path.write_bytes(body)
    with pytest.raises(BundleError) as failed:
        verify_bundle(str(path), trust_root=fingerprint)
    assert expect is None or expect in str(failed.value), str(failed.value)


def detected_everywhere(tmp_path, fingerprint: str, expect: str, offline_expect: str | None = None) -> None:
    online(expect)
    scheduled(expect)
    offline(tmp_path, fingerprint, offline_expect)


def attacker_signer() -> Ed25519Signer:
    return Ed25519Signer(Ed25519PrivateKey.generate().private_bytes_raw())


def forged_tombstone(stream: str, through_seq: int, signer: Ed25519Signer) -> dict:
    fields = {
        "stream": stream,
        "through_seq": through_seq,
        "through_hash": row(stream, through_seq).hash,
        "purged_count": through_seq,
        "purged_at": timezone.now().isoformat(),
        "key_id": signer.key_id,
    }
    return fields | {"algorithm": "ed25519", "signature": signer.sign(chain.tombstone_payload(fields))}


# --- 1. the worst: a planted key and a forged tombstone erase a tenant under legal hold ------------------------


@pytest.mark.services
def test_a_planted_key_and_a_forged_tombstone_do_not_erase_a_held_tenant_as_the_audit_admin(roles, pinned, tmp_path):
    _portal, admin = roles
    tenant = TenantFactory()
    stream = sealed_tenant_records(tenant, 5)
    legal_hold_place(actor=None, tenant_id=tenant.pk, reason="case 2026-32")
    sealed()
    evil = attacker_signer()
    tombstone = forged_tombstone(stream, 6, evil)
    with as_role(admin) as cursor:  # no superuser: the audit admin's own privileges
        cursor.execute(
            "INSERT INTO audit_signingkey (key_id, algorithm, public_key_pem, first_used_at) "
            "VALUES (%s, %s, %s, now())",
            [evil.key_id, "ed25519", evil.public_key_pem()],
        )
        cursor.execute(
            "INSERT INTO audit_tombstone (stream, through_seq, through_hash, purged_count, purged_at, algorithm, "
            "key_id, signature) VALUES (%(stream)s, %(through_seq)s, %(through_hash)s, %(purged_count)s, "
            "%(purged_at)s, %(algorithm)s, %(key_id)s, %(signature)s)",
            tombstone,
        )
        cursor.execute("DELETE FROM audit_auditrecord WHERE stream = %s", [stream])
    assert not AuditRecord.objects.filter(stream=stream).exists()  # the database let it happen ...
    # ... the witness does not take the forged purge ...
    with pytest.raises(witness.WitnessError, match="outside the log's key chain"):
        witness.get_witness().add_tombstone(witness.log_id(), tombstone)
    # ... and every verifier sees the erasure.
    detected_everywhere(tmp_path, pinned, "is not signed by a key of the trust root (forged purge)")
    online("the witness cosigned 6 records of this stream")


# --- 2. the witness itself --------------------------------------------------------------------------------


def test_a_line_appended_to_the_witness_journal_makes_every_verifier_fail_closed(pinned, tmp_path):
    from audit import conf

    evil = attacker_signer()
    journal = conf.witness_state_dir() / "journal.jsonl"
    line = {
        "prev": "0" * 64,
        "entry": {
            "type": "rotation",
            "log": witness.log_id(),
            "rotation": {"statement": {"public_key_pem": evil.public_key_pem()}},
        },
        "signature": base64.b64encode(os.urandom(64)).decode(),
    }
    with journal.open("a") as handle:
        handle.write(json.dumps(line) + "\n")
    witness._embedded.clear()  # a fresh process reads the journal from the start
    detected_everywhere(tmp_path, pinned, "the witness cannot be read", "witness cannot be read")
    online("is not signed by the witness or does not link")


def test_the_witness_refuses_a_rotation_the_current_key_did_not_sign_and_a_rewritten_history(pinned):
    client, log = witness.get_witness(), witness.log_id()
    evil = attacker_signer()
    statement = transparency.rotation_statement(
        log_id=log, number=1, previous_key_id=get_signer().key_id, public_key_pem=evil.public_key_pem(), at="now"
    )
    with pytest.raises(witness.WitnessError, match="not signed by the key it replaces"):
        client.add_rotation(
            log, {"statement": statement, "signature": evil.sign(transparency.rotation_payload(statement))}
        )
    # Whoever holds the portal's signing key rewrites a witnessed record and checkpoints the new history: the
    # witness refuses it (it does not extend what it cosigned), and verification names the rewrite.
    stream = next(s for s in ChainHead.objects.values_list("stream", flat=True) if s.startswith("tenant:"))
    raw("UPDATE audit_auditrecord SET target = 'job:innocent' WHERE stream = %s AND seq = 1", [stream])
    online("was edited")


# --- 3. the database-side attacks, as the role that can do each ----------------------------------------------


def test_a_middle_delete_with_triggers_disabled_is_detected(pinned, tmp_path):
    stream = sealed_tenant_records(TenantFactory(), 6)
    raw("DELETE FROM audit_auditrecord WHERE stream = %s AND seq IN (3, 4)", [stream])
    detected_everywhere(tmp_path, pinned, "records seq 3..4 were deleted", "deleted")


def test_a_cut_tail_with_the_head_moved_back_is_detected(pinned, tmp_path):
    stream = sealed_tenant_records(TenantFactory(), 6)
    raw("DELETE FROM audit_auditrecord WHERE stream = %s AND seq > 4", [stream])
    raw("DELETE FROM audit_checkpoint WHERE stream = %s", [stream])
    raw("DELETE FROM audit_cosignature WHERE stream = %s", [stream])
    raw(
        "UPDATE audit_chainhead SET seq = 4, hash = %s, checkpoint_seq = 0, witnessed_seq = 0 WHERE stream = %s",
        [row(stream, 4).hash, stream],
    )
    detected_everywhere(
        tmp_path, pinned, "the witness cosigned 6 records of this stream, the database holds records only up to seq 4"
    )


def test_a_whole_tenant_stream_dropped_from_the_database_is_detected(pinned, tmp_path):
    stream = sealed_tenant_records(TenantFactory(), 4)
    for table in ("audit_auditrecord", "audit_checkpoint", "audit_cosignature", "audit_chainhead"):
        raw(f"DELETE FROM {table} WHERE stream = %s", [stream])
    detected_everywhere(tmp_path, pinned, "(the whole stream is gone)")


@pytest.mark.services
def test_a_data_key_overwritten_by_the_audit_admin_fails_the_seal_check_instead_of_skipping_it(roles, pinned, tmp_path):
    _portal, admin = roles
    tenant = TenantFactory()
    stream = sealed_tenant_records(tenant, 3)
    with as_role(admin) as cursor:
        cursor.execute("UPDATE audit_datakey SET wrapped_key = %s WHERE tenant_id = %s", [os.urandom(60), tenant.pk])
    online(f"KEY: {stream}: record seq 1: its data key")
    scheduled("does not unwrap")


@pytest.mark.services
def test_a_planted_data_key_that_does_not_unwrap_fails(roles, pinned):
    portal, _admin = roles
    tenant = TenantFactory()
    stream = sealed_tenant_records(tenant, 2)
    with as_role(portal) as cursor:  # the portal role may INSERT data keys
        cursor.execute(
            "INSERT INTO audit_datakey (key_id, tenant_id, cipher, master_key_id, wrapped_key, created_at) "
            "VALUES ('planted', %s, 'aes-256-gcm', 'dev1', %s, now())",
            [tenant.pk, os.urandom(60)],
        )
    record = row(stream, 2)
    record.key_id = "planted"
    record.hash = chain.record_hash(record.prev_hash, record_header(record), bytes(record.ciphertext))
    raw("UPDATE audit_auditrecord SET key_id = 'planted', hash = %s WHERE id = %s", [record.hash, record.pk])
    raw("UPDATE audit_chainhead SET hash = %s WHERE stream = %s", [record.hash, stream])
    online("its data key planted does not unwrap")


@pytest.mark.services
def test_the_portal_role_cannot_pause_checkpointing_or_move_a_head_back(roles, pinned):
    portal, _admin = roles
    stream = sealed_tenant_records(TenantFactory(), 3)
    audit_record(action="job.submit", actor=None, tenant=int(stream.split(":")[1]), target="job:late")
    for sql in (
        "UPDATE audit_chainhead SET checkpoint_seq = seq WHERE stream = %s",  # no checkpoint at seq 4
        "UPDATE audit_chainhead SET seq = 1 WHERE stream = %s",
        "UPDATE audit_chainhead SET witnessed_seq = 0 WHERE stream = %s",
    ):
        with pytest.raises(DatabaseError), as_role(portal) as cursor:
            cursor.execute(sql, [stream])


def test_checkpointing_paused_by_the_superuser_is_found_once_the_window_passes(settings, pinned, tmp_path):
    settings.GPUPOOL_AUDIT_WITNESS_SLACK_SECONDS = 0
    stream = sealed_tenant_records(TenantFactory(), 2)
    audit_record(action="job.submit", actor=None, tenant=int(stream.split(":")[1]), target="job:unsealed")
    raw("ALTER TABLE audit_chainhead DISABLE TRIGGER USER")
    raw("UPDATE audit_chainhead SET checkpoint_seq = seq, witnessed_seq = seq WHERE stream = %s", [stream])
    raw("ALTER TABLE audit_chainhead ENABLE TRIGGER USER")
    sealed()  # beat runs, but finds nothing to do
    time.sleep(1.2)
    online("the witness is behind the database: records seq 3 are covered by no cosigned checkpoint")
    scheduled("the witness is behind the database")


@pytest.mark.services
def test_a_key_planted_by_the_portal_role_signs_nothing_a_verifier_accepts(roles, pinned, tmp_path):
    portal, _admin = roles
    stream = sealed_tenant_records(TenantFactory(), 2)
    evil = attacker_signer()
    head = row(stream, 2)
    fields = {
        "stream": stream,
        "from_seq": 1,
        "seq": 2,
        "head_hash": head.hash,
        "merkle_root": chain.merkle_root([row(stream, 1).hash, head.hash]),
        "signed_at": timezone.now().isoformat(),
        "key_id": evil.key_id,
    }
    with as_role(portal) as cursor:
        cursor.execute(
            "INSERT INTO audit_signingkey (key_id, algorithm, public_key_pem, first_used_at) "
            "VALUES (%s, %s, %s, now())",
            [evil.key_id, "ed25519", evil.public_key_pem()],
        )
        cursor.execute(
            "INSERT INTO audit_keyrotation (number, statement, signature, created_at) VALUES (1, %s, %s, now())",
            [json.dumps({"key_id": evil.key_id, "public_key_pem": evil.public_key_pem()}), "forged"],
        )
    raw("ALTER TABLE audit_checkpoint DISABLE TRIGGER USER")
    raw("DELETE FROM audit_checkpoint WHERE stream = %s", [stream])
    raw("ALTER TABLE audit_checkpoint ENABLE TRIGGER USER")
    Checkpoint.objects.create(**fields, algorithm="ed25519", signature=evil.sign(chain.checkpoint_payload(fields)))
    online("checkpoint at seq 2 has a bad signature")
    scheduled("bad signature")


# --- 4. the offline verifier against a bundle made by someone holding the portal's key ----------------------


def _bundle(tmp_path) -> tuple[dict[str, bytes], str]:
    now = timezone.now()
    with TestCase.captureOnCommitCallbacks(execute=True):
        body, _ = build_bundle(actor=AuditorFactory(), start=now - dt.timedelta(hours=1), end=now)
    path = tmp_path / "genuine.zip"
    path.write_bytes(body)
    with zipfile.ZipFile(path) as bundle:
        return {n: bundle.read(n) for n in bundle.namelist()}, str(path)


def _resign(tmp_path, members: dict[str, bytes], manifest: dict, signer) -> str:
    """Re-hash and re-sign the bundle with ``signer`` (the portal's own key: an insider with the portal's env)."""
    for name in list(manifest["files"]):
        manifest["files"][name] = hashlib.sha256(members[name]).hexdigest()
    members["manifest.json"] = json.dumps(manifest, indent=1, sort_keys=True).encode()
    members["manifest.sig"] = (signer.sign(members["manifest.json"]) + "\n").encode()
    path = tmp_path / "forged.zip"
    with zipfile.ZipFile(path, "w") as target:
        for name, body in members.items():
            target.writestr(name, body)
    return str(path)


def _drop(members: dict[str, bytes], manifest: dict, stream: str, *, above: int = 0) -> None:
    lines = [json.loads(x) for x in members["records.jsonl"].decode().splitlines()]
    kept = [x for x in lines if x["header"]["stream"] != stream or x["header"]["seq"] <= above]
    members["records.jsonl"] = "".join(json.dumps(x, sort_keys=True, ensure_ascii=False) + "\n" for x in kept).encode()
    rows = members["records.csv"].decode().splitlines(keepends=True)
    members["records.csv"] = "".join(
        [rows[0]] + [r for r, x in zip(rows[1:], lines, strict=True) if x in kept]
    ).encode()
    if above:
        manifest["streams"][stream].update(
            to_seq=above, records=sum(1 for x in kept if x["header"]["stream"] == stream)
        )
    else:
        del manifest["streams"][stream]


def test_a_bundle_with_a_stream_left_out_fails_offline_even_signed_with_the_portals_key(pinned, tmp_path):
    stream = sealed_tenant_records(TenantFactory(), 3)
    members, genuine = _bundle(tmp_path)
    assert verify_bundle(genuine, trust_root=pinned)["streams"] >= 2
    manifest = json.loads(members["manifest.json"])
    _drop(members, manifest, stream)
    with pytest.raises(BundleError, match="a stream left out"):
        verify_bundle(_resign(tmp_path, members, manifest, get_signer()), trust_root=pinned)


def test_a_bundle_with_its_tail_cut_fails_offline_even_signed_with_the_portals_key(pinned, tmp_path):
    stream = sealed_tenant_records(TenantFactory(), 5)
    members, _genuine = _bundle(tmp_path)
    manifest = json.loads(members["manifest.json"])
    _drop(members, manifest, stream, above=3)
    with pytest.raises(BundleError, match="a cut tail"):
        verify_bundle(_resign(tmp_path, members, manifest, get_signer()), trust_root=pinned)


def test_a_full_rewrite_with_fresh_keys_and_a_fresh_witness_fails_the_pinned_trust_root(pinned, tmp_path, settings):
    """Every table rewritten, a new signing key, a new witness of the attacker's: internally consistent, and
    refused because its trust root is not the one the auditor pinned."""
    settings.GPUPOOL_AUDIT_SIGNING_KEY = base64.b64encode(os.urandom(32)).decode()
    settings.GPUPOOL_AUDIT_WITNESS_PATH = str(tmp_path / "attackers-witness.jsonl")
    raw("ALTER TABLE audit_checkpoint DISABLE TRIGGER USER")
    raw("ALTER TABLE audit_cosignature DISABLE TRIGGER USER")
    for table in ("audit_cosignature", "audit_checkpoint"):
        raw(f"DELETE FROM {table}")
    raw("ALTER TABLE audit_checkpoint ENABLE TRIGGER USER")
    raw("ALTER TABLE audit_cosignature ENABLE TRIGGER USER")
    raw("UPDATE audit_chainhead SET checkpoint_seq = 0, witnessed_seq = 0")
    sealed()
    _members, path = _bundle(tmp_path)
    assert verify_bundle(path)["records"] > 0  # consistent on its own terms ...
    with pytest.raises(BundleError, match="is not the pinned"):
        verify_bundle(path, trust_root=pinned)  # ... but not the pinned trust root
    online("is not the pinned")


def test_offline_fails_closed_on_an_unknown_signing_key_in_a_checkpoint(pinned, tmp_path):
    members, _genuine = _bundle(tmp_path)
    manifest = json.loads(members["manifest.json"])
    signed = json.loads(members["checkpoints.json"])
    signed["checkpoints"][0]["key_id"] = "0" * 16
    members["checkpoints.json"] = json.dumps(signed).encode()
    with pytest.raises(BundleError, match="not in the trust root's key chain"):
        verify_bundle(_resign(tmp_path, members, manifest, get_signer()), trust_root=pinned)


# --- 5. what still works: rotation, and an honest trail ------------------------------------------------------


def test_a_rotation_signed_by_the_current_key_is_trusted_everywhere(pinned, tmp_path, settings):
    from audit.services import signing_key_rotate

    new_seed = os.urandom(32)
    signing_key_rotate(actor=None, new_seed=new_seed)
    settings.GPUPOOL_AUDIT_SIGNING_KEY = base64.b64encode(new_seed).decode()
    sealed_tenant_records(TenantFactory(), 2)
    report = verify_trail(record_result=False)
    assert report.ok, [f.message for f in report.findings]
    assert run_integrity_check(full=True).ok and latest_failure() is None
    _members, path = _bundle(tmp_path)
    assert verify_bundle(path, trust_root=pinned)["records"] > 0
    assert DataKey.objects.exists()
