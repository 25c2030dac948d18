"""``gpupool agent_bootstrap_token [--ttl SECONDS]``: make a one-time token for ``gpupool-agent register``."""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from kernel.api import DomainError
from scheduler.fleet.services.enrolment import bootstrap_token_create


class Command(BaseCommand):
    help = "Create a one-time bootstrap token for registering a node agent; it is printed once, never stored."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--ttl", type=int, default=settings.GPUPOOL_BOOTSTRAP_TOKEN_TTL_S, help="seconds the token is valid"
        )
        parser.add_argument("--description", default="", help="a note for the audit trail (which node it is for)")

    def handle(self, *args, ttl: int, description: str, **options) -> None:
        try:
            token, secret = bootstrap_token_create(actor=None, ttl_s=ttl, description=description)
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        self.stderr.write(f"bootstrap token (valid until {token.expires_at:%Y-%m-%d %H:%M:%S} UTC, works once):")
        self.stdout.write(secret)
