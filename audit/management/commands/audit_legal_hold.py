from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from audit.services import legal_hold_place, legal_hold_release
from kernel.api import DomainError


class Command(BaseCommand):
    help = "Place or release a legal hold on a tenant's audit records (or the platform's, without --tenant)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--tenant", type=int, default=None, help="tenant id (omit for the platform stream)")
        parser.add_argument("--reason", default="", help="case or request number (required to place a hold)")
        parser.add_argument("--release", action="store_true", help="release the hold instead")

    def handle(self, *args, **options) -> None:
        try:
            if options["release"]:
                count = legal_hold_release(actor=None, tenant_id=options["tenant"])
                self.stdout.write(self.style.SUCCESS(f"released {count} hold(s)"))
            else:
                hold = legal_hold_place(actor=None, tenant_id=options["tenant"], reason=options["reason"])
                self.stdout.write(self.style.SUCCESS(f"legal hold {hold.pk} is active"))
        except DomainError as exc:
            raise CommandError(exc.message) from exc
