"""A demo node as the demo data know it once registered: what ``portal.demo`` hands ``portal.demo_history``, kept
here so that the history needs nothing back from the module that loads it."""

from __future__ import annotations

from dataclasses import dataclass

from nodeagent.demo import DemoNode


@dataclass(frozen=True)
class DemoNodeRow:
    """A registered demo node: its row's id, what the demo agent simulates on it, and its cards' UUID → id."""

    node_id: int
    demo: DemoNode
    device_ids: dict[str, int]
