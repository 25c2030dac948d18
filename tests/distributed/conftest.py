"""The distributed-training tests run a real deployment in processes (tests/resilience/cluster.py)."""

from __future__ import annotations

import shutil

import pytest

from tests.distributed.helpers import shared_examples
from tests.resilience.conftest import make_cluster  # noqa: F401  (the fixture, shared)


@pytest.fixture
def examples():
    """The manual's example scripts where a sandboxed job can read them (``helpers.shared_examples``)."""
    folder = shared_examples()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
