"""Simulated agents for ``gpupool demo``.

``portal/demo.py`` mints one bootstrap token per demo agent, writes it with :func:`write_bootstrap_token` to
the path from :func:`demo_agent_paths`, and starts :func:`demo_agent_command`. The agent trades the token for
a credential (retrying while the portal starts), deletes the token file and runs a simulated node. Each
agent has its own credential file and work dir under ``<data dir>/demo-agents/sim-NN/``.
"""

from __future__ import annotations

import os
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeagent import __version__, protocol
from nodeagent.backends.simulated import MODELS, SimulatedBackend

#: The fleet the demo shows, one node per agent (cycled past the end): (simulated model, cards). README.md
#: names the same cards ("8 H100, 4 A100 and 8 Ascend 910B cards"); a test keeps the two in step.
DEMO_NODES: list[tuple[str, int]] = [("H100-80G", 8), ("A100-40G", 4), ("910B", 8)]
#: How a person names each simulated model (the README's words for the demo's cards).
DEMO_MODEL_WORDS: dict[str, str] = {"H100-80G": "H100", "A100-40G": "A100", "910B": "Ascend 910B"}


@dataclass(frozen=True)
class DemoNode:
    """Demo agent ``index``'s node: its name, simulated model, card count and noise seed."""

    index: int
    name: str
    model: str
    cards: int

    @property
    def seed(self) -> int:
        return self.index

    def backend(self) -> SimulatedBackend:
        """The same simulated cards (UUIDs, noise) the demo agent of this node reports."""
        return SimulatedBackend(node_name=self.name, cards=self.cards, model=self.model, seed=self.seed)


def demo_node(index: int) -> DemoNode:
    model, cards = DEMO_NODES[index % len(DEMO_NODES)]
    return DemoNode(index=index, name=f"sim-{index:02d}", model=model, cards=cards)


def demo_fleet_cards(count: int = len(DEMO_NODES)) -> dict[str, int]:
    """Cards per model (in :data:`DEMO_MODEL_WORDS`' words) of the first ``count`` demo nodes."""
    cards: dict[str, int] = {}
    for index in range(count):
        node = demo_node(index)
        words = DEMO_MODEL_WORDS.get(node.model, MODELS[node.model].model)
        cards[words] = cards.get(words, 0) + node.cards
    return cards


def demo_hello(index: int) -> dict[str, Any]:
    """The ``hello`` frame demo agent ``index`` sends (as a dict), so the portal can know the node's cards
    before the agent process is up: the demo's history runs on the very devices the agent then reports."""
    node = demo_node(index)
    backend = node.backend()
    return protocol.to_dict(
        protocol.Hello(
            node_name=node.name,
            agent_version=__version__,
            hostname=socket.gethostname(),
            cpu_cores=os.cpu_count() or 0,
            memory_mib=0,
            labels={"gpupool.io/backend": backend.name},
            topology=backend.topology(),
            devices=backend.inventory(),
            workloads=[],
            workloads_complete=True,
        )
    )


@dataclass(frozen=True)
class DemoAgentPaths:
    node_name: str
    token_file: Path
    credential_file: Path
    work_dir: Path


def _data_dir(data_dir: str | os.PathLike | None) -> Path:
    return Path(data_dir or os.environ.get("GPUPOOL_DATA_DIR") or "var").resolve()


def demo_agent_paths(*, index: int, data_dir: str | os.PathLike | None = None) -> DemoAgentPaths:
    node_name = demo_node(index).name
    root = _data_dir(data_dir) / "demo-agents" / node_name
    return DemoAgentPaths(
        node_name=node_name,
        token_file=root / "bootstrap-token",
        credential_file=root / "credential.json",
        work_dir=root / "work",
    )


def write_bootstrap_token(path: Path, secret: str) -> None:
    """Write a one-time token readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(descriptor, 0o600)
        os.write(descriptor, secret.encode())
    finally:
        os.close(descriptor)


#: The demo agents' job ports: a slice of 29500-32767 each.
DEMO_PORT_BASE = 29500
DEMO_PORTS_PER_AGENT = 200


def demo_sandbox_mode() -> str:
    """The real sandbox (``namespaces``) where it can work — as root, with util-linux ``unshare`` — else
    ``none``: the demo must run on a laptop without root, and says which it runs."""
    return "namespaces" if os.geteuid() == 0 and shutil.which("unshare") else "none"


def describe_sandbox_mode(mode: str) -> str:
    if mode == "namespaces":
        return "namespaces (each workload in its own uid, namespaces and cgroups, as in production)"
    return "none (not root: workloads run unconfined as your user; run the demo as root for the real sandbox)"


def demo_agent_command(
    *,
    python: str,
    server_url: str,
    index: int,
    data_dir: str | os.PathLike | None = None,
    sandbox: str | None = None,
) -> list[str]:
    """The command line of demo agent ``index``: a simulated node ``sim-NN`` of the model DEMO_NODES picks,
    sandboxed as :func:`demo_sandbox_mode` says unless ``sandbox`` is given."""
    paths = demo_agent_paths(index=index, data_dir=data_dir)
    node = demo_node(index)
    return [
        python,
        "-m",
        "nodeagent",
        "demo-run",
        "--server",
        server_url,
        "--node-name",
        paths.node_name,
        "--bootstrap-token-file",
        str(paths.token_file),
        "--credential-file",
        str(paths.credential_file),
        "--work-dir",
        str(paths.work_dir),
        "--backend",
        "simulated",
        "--model",
        node.model,
        "--cards",
        str(node.cards),
        "--seed",
        str(node.seed),
        "--sandbox",
        sandbox or demo_sandbox_mode(),
        # The demo's agents share one machine: each its own address on the loopback network, its own ports and
        # its own isolation rules, as separate machines would have.
        "--address",
        f"127.0.0.{index + 1}",
        "--job-ports",
        f"{DEMO_PORT_BASE + index * DEMO_PORTS_PER_AGENT}-{DEMO_PORT_BASE + (index + 1) * DEMO_PORTS_PER_AGENT - 1}",
        "--network-table",
        f"gpupool_{paths.node_name.replace('-', '_')}",
        "--network-isolation",
        "nftables" if shutil.which("nft") else "none",
    ]
