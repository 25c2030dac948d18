"""Install what the test suite needs beyond Python packages (run by `make test`).

Kept in one place so `make test` on a fresh machine and CI do the same thing. Each step is idempotent and
quick when its prerequisite is already there.
"""

from __future__ import annotations


def main() -> None:
    # Later parts add steps here (e.g. Debian's chromium for the browser tests).
    pass


if __name__ == "__main__":
    main()
