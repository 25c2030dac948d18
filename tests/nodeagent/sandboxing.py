"""What the tests that start real agents need to run them with the real sandbox where it exists (root: CI).

A sandboxed workload runs as an unprivileged uid that cannot read ``/root``, where a pyenv interpreter (the
test's own ``sys.executable``) often lives; workload commands use the system's ``/usr/bin/python3`` instead.
"""

from __future__ import annotations

import os
import shutil
import sys

#: True where ``gpupool-agent run`` can sandbox workloads (root, util-linux ``unshare``).
SANDBOX_AVAILABLE = os.geteuid() == 0 and shutil.which("unshare") is not None
#: The sandbox mode the tests' agents run with: the real one where it can work.
SANDBOX_MODE = "namespaces" if SANDBOX_AVAILABLE else "none"
#: An interpreter every uid can run (for workload commands).
WORKLOAD_PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


def sandbox_args() -> list[str]:
    """``gpupool-agent run`` options for the tests' agents."""
    return ["--sandbox", SANDBOX_MODE]
