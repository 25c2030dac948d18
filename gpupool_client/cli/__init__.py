"""``gpupool-cli``: submit, list, watch and cancel jobs on a gpupool server from a terminal.

Every command goes through the SDK (:mod:`gpupool_client.client`); nothing here talks HTTP itself. The group
and error handling live in ``app``, the commands in ``account``, ``jobs`` and ``pool``, the formats in
``output``. Importing this package registers every command.
"""

from gpupool_client.cli import account, jobs, pool
from gpupool_client.cli.app import cli, main, run

__all__ = ["account", "cli", "jobs", "main", "pool", "run"]
