#!/usr/bin/env python
"""Django's command-line utility for gpupool (the same as the ``gpupool`` console script)."""

from portal.cli import main

if __name__ == "__main__":
    main()
