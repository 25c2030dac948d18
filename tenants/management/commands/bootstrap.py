"""``gpupool bootstrap``: create the first security admin and system admin without prompts.

Values come from flags or, when a flag is absent, from the environment:

    GPUPOOL_BOOTSTRAP_SECURITY_ADMIN / GPUPOOL_BOOTSTRAP_SECURITY_ADMIN_PASSWORD / …_EMAIL
    GPUPOOL_BOOTSTRAP_SYSTEM_ADMIN   / GPUPOOL_BOOTSTRAP_SYSTEM_ADMIN_PASSWORD   / …_EMAIL

Passwords are better given through the environment (flags show up in ``ps``). Idempotent: an account that
already exists with the same role is left alone (its password is not changed); one that exists with another
role is an error, because one account cannot hold two platform roles.
"""

from __future__ import annotations

import os

from django.core.management.base import BaseCommand, CommandError, CommandParser

from kernel.api import DomainError
from tenants.models import PlatformRole, User
from tenants.services.identity import user_create

ROLES = [
    ("security_admin", PlatformRole.SECURITY_ADMIN, "GPUPOOL_BOOTSTRAP_SECURITY_ADMIN"),
    ("system_admin", PlatformRole.SYSTEM_ADMIN, "GPUPOOL_BOOTSTRAP_SYSTEM_ADMIN"),
]


class Command(BaseCommand):
    help = "Create the first security admin and system admin (non-interactive, idempotent)."

    def add_arguments(self, parser: CommandParser) -> None:
        for option, _role, _env in ROLES:
            flag = option.replace("_", "-")
            parser.add_argument(f"--{flag}", dest=option, help=f"username of the {option.replace('_', ' ')}")
            parser.add_argument(f"--{flag}-password", dest=f"{option}_password")
            parser.add_argument(f"--{flag}-email", dest=f"{option}_email", default=None)

    def handle(self, *args, **options) -> None:
        wanted = []
        for option, role, env in ROLES:
            username = options.get(option) or os.environ.get(env, "")
            password = options.get(f"{option}_password") or os.environ.get(f"{env}_PASSWORD", "")
            email = options.get(f"{option}_email") or os.environ.get(f"{env}_EMAIL", "")
            if username:
                wanted.append((role, username, password, email))
        if not wanted:
            raise CommandError(
                "Nothing to do: give --security-admin/--system-admin (or set GPUPOOL_BOOTSTRAP_SECURITY_ADMIN and "
                "GPUPOOL_BOOTSTRAP_SYSTEM_ADMIN with their _PASSWORD variables)."
            )
        usernames = [username for _role, username, _pw, _email in wanted]
        if len(set(usernames)) != len(usernames):
            raise CommandError("The security admin and the system admin must be different accounts.")
        for role, username, password, email in wanted:
            existing = User.objects.filter(username=username).first()
            if existing is not None:
                if existing.platform_role != role:
                    raise CommandError(
                        f"User {username!r} already exists with platform role {existing.platform_role or 'none'!r}; "
                        f"one account cannot hold two platform roles. Pick another username for the {role}."
                    )
                self.stdout.write(f"{role} {username!r} already exists; left unchanged.")
                continue
            if not password:
                raise CommandError(f"No password for {username!r}: set the {role} password flag or variable.")
            try:
                user_create(actor=None, username=username, password=password, email=email, platform_role=role)
            except DomainError as exc:
                raise CommandError(f"Cannot create {username!r}: {exc.message}") from None
            self.stdout.write(self.style.SUCCESS(f"Created {role} {username!r}."))
