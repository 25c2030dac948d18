from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from audit.services import tenant_keys_shred
from kernel.api import DomainError


class Command(BaseCommand):
    help = (
        "Crypto-shred a tenant's audit details: destroy its data keys at the end of retention. Refused under "
        "legal hold or while the tenant has records inside the retention period. The chain still verifies."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--tenant", type=int, required=True, help="tenant id")

    def handle(self, *args, **options) -> None:
        try:
            count = tenant_keys_shred(actor=None, tenant_id=options["tenant"])
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(self.style.SUCCESS(f"destroyed {count} data key(s) of tenant {options['tenant']}"))
