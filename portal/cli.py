"""The ``gpupool`` command: Django's management commands with gpupool's settings (``gpupool demo``,
``gpupool serve``, ``gpupool migrate``, ``gpupool bootstrap`` …)."""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(["gpupool", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    main()
