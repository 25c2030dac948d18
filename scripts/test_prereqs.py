"""Install what the test suite needs beyond Python packages (run by `make test`).

Kept in one place so `make test` on a fresh machine and CI do the same thing. Each step is idempotent and
quick when its prerequisite is already there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")


def ensure_chromium() -> None:
    """Debian's chromium for the browser tests (Playwright drives it; no browser download is possible here).

    Installed with apt as root when missing; elsewhere the browser tests skip themselves and say why.
    """
    if CHROMIUM.exists():
        return
    if not shutil.which("apt-get") or os.geteuid() != 0:
        print(f"test_prereqs: {CHROMIUM} is missing and cannot be installed here; browser tests will skip")
        return
    print("test_prereqs: installing Debian's chromium for the browser tests")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=True, env=env)


def main() -> None:
    ensure_chromium()


if __name__ == "__main__":
    sys.exit(main())
