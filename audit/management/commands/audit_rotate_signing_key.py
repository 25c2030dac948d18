"""``gpupool audit_rotate_signing_key``: a new checkpoint signing key, certified by the current one."""

from __future__ import annotations

import base64
import os
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from audit import witness
from audit.services import signing_key_rotate
from audit.signing import Ed25519Signer
from kernel.api import DomainError


class Command(BaseCommand):
    help = (
        "Rotate the audit checkpoint signing key: seal and witness every stream, then have the witness accept a "
        "rotation to a new key signed by the current one (GPUPOOL_AUDIT_SIGNING_KEY). Prints the new seed: set it "
        "as GPUPOOL_AUDIT_SIGNING_KEY on every process and restart. Verifiers trust the new key only through this "
        "signed rotation."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--new-key-file", help="a file holding the new base64 seed (default: a random one)")

    def handle(self, *args, **options) -> None:
        if options["new_key_file"]:
            seed = base64.b64decode(Path(options["new_key_file"]).read_text().strip(), validate=True)
        else:
            seed = os.urandom(32)
        if len(seed) != 32:
            raise CommandError("the new key must be base64 of 32 bytes")
        try:
            rotation = signing_key_rotate(actor=None, new_seed=seed)
        except (DomainError, witness.WitnessError) as exc:
            raise CommandError(str(getattr(exc, "message", exc))) from exc
        statement = rotation["statement"]
        self.stdout.write(
            self.style.SUCCESS(
                f"rotation {statement['number']}: {statement['previous_key_id']} -> {statement['key_id']} accepted by "
                f"{witness.describe()}"
            )
        )
        if not options["new_key_file"]:
            self.stdout.write(f"GPUPOOL_AUDIT_SIGNING_KEY={base64.b64encode(seed).decode()}")
        self.stdout.write("set it on every web process, worker and beat, then restart them")
        assert Ed25519Signer(seed).key_id == statement["key_id"]
