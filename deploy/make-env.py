#!/usr/bin/env python3
"""Print deploy/.env for docker compose: .env.example with every EXAMPLE placeholder replaced by a fresh random
secret of the shape its variable needs. Standard library only.

    python3 make-env.py > .env && chmod 600 .env
"""

from __future__ import annotations

import base64
import os
import secrets
import sys
from pathlib import Path

PLACEHOLDER = "EXAMPLE-ONLY-change-me"


def _key32() -> str:
    return base64.b64encode(os.urandom(32)).decode()


# What each secret must look like (portal/production_settings.py, audit/conf.py); anything else: a password.
GENERATORS = {
    "GPUPOOL_SECRET_KEY": lambda: secrets.token_urlsafe(64),
    "GPUPOOL_AUDIT_MASTER_KEYS": lambda: f"k1:{_key32()}",
    "GPUPOOL_AUDIT_SIGNING_KEY": _key32,
}


def render(example: str) -> str:
    lines = []
    for line in example.splitlines():
        name, sep, value = line.partition("=")
        if sep and not line.lstrip().startswith("#") and value.strip() == PLACEHOLDER:
            value = GENERATORS.get(name.strip(), lambda: secrets.token_urlsafe(24))()
            line = f"{name}={value}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def main() -> None:
    example = Path(__file__).with_name(".env.example").read_text()
    sys.stdout.write(render(example))


if __name__ == "__main__":
    main()
