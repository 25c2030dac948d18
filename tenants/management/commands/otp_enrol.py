"""``gpupool otp_enrol USERNAME``: give an account a TOTP device from the command line and print its key.

For operators setting up the first admins (who then sign in with password + code); users can also enrol
themselves in the console at /accounts/otp/enrol/. ``--reset`` removes the account's devices instead.
"""

from __future__ import annotations

from base64 import b32encode

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenants.models import User
from tenants.services.identity import mfa_reset, mfa_totp_begin


class Command(BaseCommand):
    help = "Enrol (or --reset) a TOTP two-factor device for an account and print the key to add to an app."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--reset", action="store_true", help="remove the account's two-factor devices")

    def handle(self, *args, username: str, reset: bool, **options) -> None:
        user = User.objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user named {username!r}.")
        if reset:
            removed = mfa_reset(actor=None, user=user)
            self.stdout.write(f"Removed {removed} two-factor device(s) of {username!r}.")
            return
        device = mfa_totp_begin(actor=None, user=user, confirmed=True)
        self.stdout.write(f"TOTP key for {username!r} (base32): {b32encode(device.bin_key).decode()}")
        self.stdout.write(f"otpauth URI: {device.config_url}")
        self.stdout.write("Sign-in now asks this account for the 6-digit code after the password.")
