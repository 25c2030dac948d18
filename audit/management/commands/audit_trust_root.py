"""``gpupool audit_trust_root``: print the trust-root fingerprint an auditor pins, and the witness's key."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from audit import conf, transparency, witness
from audit.services import witness_genesis


class Command(BaseCommand):
    help = (
        "Print the audit trail's trust-root fingerprint (the witness's genesis entry for this database: the first "
        "signing key and the witness's key). Run it at install and hand the fingerprint to the auditor out of band; "
        "the verifiers pin it (GPUPOOL_AUDIT_TRUST_ROOT, python -m audit.bundle_verifier --trust-root)."
    )

    def handle(self, *args, **options) -> None:
        try:
            genesis = witness_genesis()
        except witness.WitnessError as exc:
            raise CommandError(f"{witness.describe()}: {exc}") from exc
        fingerprint = transparency.trust_root_fingerprint(genesis)
        statement = genesis["statement"]
        self.stdout.write(f"trust root: {fingerprint}")
        self.stdout.write(f"  log: {statement['log']} ({witness.database_identity()})")
        self.stdout.write(f"  root signing key: {statement['root_key_id']}")
        self.stdout.write(f"  witness key: {statement['witness_key']} ({witness.describe()})")
        self.stdout.write(f"  made: {statement['created_at']}")
        pinned = conf.trust_root()
        if pinned is None:
            self.stdout.write(f"not pinned here: set GPUPOOL_AUDIT_TRUST_ROOT={fingerprint} for the online checks")
        elif pinned != fingerprint:
            raise CommandError(f"GPUPOOL_AUDIT_TRUST_ROOT={pinned} is NOT this trust root")
