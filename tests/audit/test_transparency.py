"""The formats and proofs under the trust root, and the witness service: against their specifications, against
full recomputation, and as a process of its own over HTTP."""

from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from audit import transparency as tp
from audit import witness_service as ws
from audit.signing import Ed25519Signer

ROOT = Path(__file__).resolve().parents[2]


def leaves(count: int) -> list[bytes]:
    return [tp.leaf_hash(os.urandom(32).hex()) for _ in range(count)]


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=300), st.data())
def test_compact_ranges_and_consistency_proofs_agree_with_full_recomputation(total, data):
    old_size = data.draw(st.integers(min_value=0, max_value=total))
    items = leaves(total)
    old = tp.CompactRange.empty()
    old.extend(items[:old_size])
    assert old.root() == tp.tree_hash(items[:old_size])
    assert tp.CompactRange.decode(old.encode()).root() == old.root()
    proof = tp.consistency_proof(old, items[old_size:])
    assert tp.verify_consistency(old_size, total, tp.tree_hash(items[:old_size]), tp.tree_hash(items), proof)
    if 0 < old_size < total:
        # Any other history of the same size fails: one leaf of the old tree changed.
        forged = list(items)
        forged[data.draw(st.integers(min_value=0, max_value=old_size - 1))] = tp.leaf_hash("00" * 32)
        assert not tp.verify_consistency(old_size, total, tp.tree_hash(forged[:old_size]), tp.tree_hash(items), proof)
        assert not tp.verify_consistency(old_size, total, tp.tree_hash(items[:old_size]), tp.tree_hash(forged), proof)


def test_rfc6962_root_of_known_leaves():
    # RFC 6962's tree shape: 7 leaves hash as H(H(H(a,b),H(c,d)), H(H(e,f),g)).
    a, b, c, d, e, f, g = leaves(7)
    expected = tp.node_hash(tp.node_hash(tp.node_hash(a, b), tp.node_hash(c, d)), tp.node_hash(tp.node_hash(e, f), g))
    assert tp.tree_hash([a, b, c, d, e, f, g]) == expected


def test_signed_notes_and_cosignatures_follow_c2sp():
    key = Ed25519PrivateKey.generate()
    signer = tp.NoteSigner("example.com/log", key)
    body = tp.Checkpoint(origin="gpupool.audit/abc/tenant:1", size=3, root=os.urandom(32), head="ab" * 32).body()
    note = signer.sign_note(body)
    assert note.startswith(body + "\n\u2014 example.com/log ")
    verifier = tp.VerifierKey("example.com/log", tp.ALG_ED25519, signer.public_raw)
    assert tp.parse_vkey(str(verifier)) == verifier  # base64 with '+' in it too
    assert tp.note_signed_by(note, verifier)
    assert not tp.note_signed_by(note.replace("\n3\n", "\n4\n"), verifier)
    assert tp.parse_checkpoint(body).size == 3 and tp.parse_checkpoint(body).stream == "tenant:1"
    witness = tp.CosignatureSigner("witness", Ed25519PrivateKey.generate())
    line = witness.cosign(body, 1_700_000_000)
    assert tp.cosignature_time(line, body, witness.vkey) == 1_700_000_000
    assert tp.cosignature_time(line, body.replace("\n3\n", "\n4\n"), witness.vkey) is None


def test_the_key_chain_accepts_only_rotations_signed_by_the_predecessor():
    first, second, evil = (Ed25519Signer(os.urandom(32)) for _ in range(3))
    statement = tp.rotation_statement(
        log_id="l", number=1, previous_key_id=first.key_id, public_key_pem=second.public_key_pem(), at="t"
    )
    good = {"statement": statement, "signature": first.sign(tp.rotation_payload(statement))}
    assert [k for k, _ in tp.key_chain(first.public_key_pem(), [good])] == [first.key_id, second.key_id]
    forged = {"statement": statement, "signature": evil.sign(tp.rotation_payload(statement))}
    with pytest.raises(tp.ProofError, match="not signed by the key it replaces"):
        tp.key_chain(first.public_key_pem(), [forged])


def _checkpoint(signer: Ed25519Signer, log: str, stream: str, tree: tp.CompactRange) -> str:
    body = tp.Checkpoint(origin=tp.origin(log, stream), size=tree.size, root=tree.root()).body()
    name = tp.log_key_name(log)
    raw = tp.raw_public_key(signer.public_key_pem())
    blob = tp.key_hash(name, tp.ALG_ED25519, raw) + base64.b64decode(signer.sign(body.encode()))
    return f"{body}\n\u2014 {name} {base64.b64encode(blob).decode()}\n"


def test_the_witness_cosigns_only_extensions_by_the_current_key(tmp_path):
    witness = ws.Witness(tmp_path / "w")
    signer, evil = Ed25519Signer(os.urandom(32)), Ed25519Signer(os.urandom(32))
    genesis = witness.genesis("log1", signer.public_key_pem())
    assert tp.check_genesis(genesis, tp.trust_root_fingerprint(genesis))[1] == signer.public_key_pem()
    items = leaves(10)
    tree = tp.CompactRange.empty()
    tree.extend(items[:4])
    line = witness.add_checkpoint(0, [], _checkpoint(signer, "log1", "s", tree))
    assert line.startswith("\u2014 gpupool-witness ")
    old = tree.copy()
    tree.extend(items[4:])
    with pytest.raises(ws.Conflict) as conflict:
        witness.add_checkpoint(0, [], _checkpoint(signer, "log1", "s", tree))
    assert conflict.value.size == 4
    with pytest.raises(ws.BadProof):  # a proof for another history
        witness.add_checkpoint(4, tp.consistency_proof(old, leaves(6)), _checkpoint(signer, "log1", "s", tree))
    with pytest.raises(ws.Forbidden):  # a key outside the chain
        witness.add_checkpoint(4, tp.consistency_proof(old, items[4:]), _checkpoint(evil, "log1", "s", tree))
    witness.add_checkpoint(4, tp.consistency_proof(old, items[4:]), _checkpoint(signer, "log1", "s", tree))
    # Another process on the same state sees it; a line someone else appended stops it (fail closed).
    again = ws.Witness(tmp_path / "w")
    assert again.state("log1")["streams"]["s"]["size"] == 10
    with (tmp_path / "w" / "journal.jsonl").open("a") as journal:
        journal.write('{"prev": "x", "entry": {"type": "genesis", "log": "log2"}, "signature": "AAAA"}\n')
    with pytest.raises(ws.Corrupt):
        ws.Witness(tmp_path / "w").state("log1")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's, with python3-cryptography: an interpreter any user may run


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON),
    reason="starts the witness under a user of its own (CI runs as root)",
)
def test_the_witness_service_runs_as_its_own_user_over_http(tmp_path):
    """The production shape: the witness as a separate process under another uid, its state unreadable to the
    portal's user; the portal's HTTP client drives the C2SP add-checkpoint call."""
    from audit.witness import HttpWitness

    # The service is two standard-library modules: installed where its user can read them, as a package would be
    # (pytest's own temporary folders are private to root).
    base = Path(tempfile.mkdtemp(prefix="gpupool-witness-test-"))
    base.chmod(0o755)
    package = base / "site" / "audit"
    package.mkdir(parents=True)
    for name in ("__init__.py", "transparency.py", "witness_service.py"):
        shutil.copy(ROOT / "audit" / name, package / name)
    (base / "site").chmod(0o755)
    package.chmod(0o755)
    state = base / "witness-state"
    state.mkdir()
    os.chown(state, 65534, 65534)
    port = _free_port()
    process = subprocess.Popen(
        [
            SYSTEM_PYTHON,
            "-m",
            "audit.witness_service",
            "serve",
            "--state-dir",
            str(state),
            "--listen",
            f"127.0.0.1:{port}",
        ],
        cwd=base / "site",
        user=65534,
        group=65534,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        client = HttpWitness(f"http://127.0.0.1:{port}")
        for _ in range(100):
            try:
                info = client.info()
                break
            except ws.WitnessError:
                time.sleep(0.05)
        else:
            raise AssertionError(process.stdout.read().decode() if process.stdout else "no output")
        signer = Ed25519Signer(os.urandom(32))
        genesis = client.genesis("log1", signer.public_key_pem())
        assert genesis["statement"]["witness_key"] == info["witness_key"]
        tree = tp.CompactRange.empty()
        tree.extend(leaves(3))
        line = client.add_checkpoint(0, [], _checkpoint(signer, "log1", "tenant:1", tree))
        body = tp.Checkpoint(origin=tp.origin("log1", "tenant:1"), size=3, root=tree.root()).body()
        assert tp.cosignature_time(line, body, tp.parse_vkey(info["witness_key"])) is not None
        assert client.add_checkpoint(3, [], _checkpoint(signer, "log1", "tenant:1", tree)) == line  # idempotent
        tree.extend(leaves(2))
        with pytest.raises(ws.Conflict) as conflict:  # 409 with the witness's size
            client.add_checkpoint(1, [], _checkpoint(signer, "log1", "tenant:1", tree))
        assert conflict.value.size == 3
        assert (state / "witness.key").stat().st_uid == 65534
        assert oct((state / "witness.key").stat().st_mode & 0o777) == "0o600"
        assert client.manifest("log1")["statement"]["streams"]["tenant:1"][0] == 3
    finally:
        process.terminate()
        process.wait(timeout=10)
        shutil.rmtree(base, ignore_errors=True)
