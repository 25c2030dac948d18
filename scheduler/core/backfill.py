"""Step 5, backfill: hold capacity for a blocked queue head so smaller jobs behind it cannot delay it.

When the first job in queue order that wants a flavor cannot be placed (and no preemption helps), the cycle
picks the devices where it will be able to start soonest — judged by the ``expected_end_at`` of what runs
there (unknown ends count as never, so the devices with the most free capacity win) — and *holds* them:
no later job in this cycle may use them. With ``Policy.backfill`` on, later (smaller) jobs still start in
any hole outside the held devices, which cannot delay the head; with it off, nothing behind a blocked head
starts on that flavor at all (strict order). A job with a ``runtime_estimate_s`` that ends before the held
devices are expected to be free may also use them (EASY backfill): the head would wait for those devices
anyway. (An estimate that is exceeded can delay the head; the Django side enforces max runtimes.)
"""

from __future__ import annotations

import math

from .capacity import Cluster
from .placement import Placer
from .types import MILLIS_PER_DEVICE, PendingJob, Snapshot, Topology

# Nodes compared when choosing where a blocked head waits (most free cards first); bounds the work.
MAX_NODES = 512


class HeadReservations:
    def __init__(self, snapshot: Snapshot, cluster: Cluster, placer: Placer, *, max_heads: int) -> None:
        self.c = cluster
        self.placer = placer
        self.max_heads = max_heads
        self.now = snapshot.now
        self.heads: dict[str, str] = {}  # flavor -> job id of its blocked head
        self._flavor_nodes: dict[str, list[int]] = {}
        self.held: dict[str, tuple[list[int], float]] = {}  # flavor -> (held devices, when they are all free)
        # When each device is expected to be completely free.
        self.free_at = [snapshot.now] * len(cluster.dev_uuid)
        for alloc in snapshot.allocations:
            d = cluster.dev_id.get(alloc.device_uuid)
            if d is not None:
                end = alloc.expected_end_at if alloc.expected_end_at is not None else math.inf
                self.free_at[d] = max(self.free_at[d], end)
        for res in snapshot.reservations:
            d = cluster.dev_id.get(res.device_uuid)
            if d is not None:
                self.free_at[d] = math.inf

    def head(self, flavor: str) -> str | None:
        return self.heads.get(flavor)

    def reserve(self, job: PendingJob, flavor: str, count: int) -> tuple[list[int], float] | None:
        """Hold devices for ``job`` as the head of ``flavor``'s queue; returns them and when they free up."""
        if flavor in self.heads or len(self.heads) >= self.max_heads:
            return None
        req = job.request
        per = 1 if req.fractional else req.device_count
        groups = [(count * per, True)] if job.topology == Topology.SAME_NODE else [(per, False)] * count
        chosen: list[int] = []
        for n_devices, _ in groups:
            pick = self._soonest(job, flavor, n_devices, excluded=chosen)
            if pick is None:
                for d in chosen:
                    self.c.release(d)
                return None
            for d in pick:
                self.c.hold(d, job.job_id)
            chosen.extend(pick)
        self.heads[flavor] = job.job_id
        shadow = max((self.free_at[d] for d in chosen), default=self.now)
        self.held[flavor] = (chosen, shadow)
        return chosen, shadow

    def window(self, flavor: str, job: PendingJob) -> list[int] | None:
        """Held devices ``job`` may backfill: it says it ends (``runtime_estimate_s``) before they are all
        expected to be free for the head, so it cannot delay it. None when it may not."""
        entry = self.held.get(flavor)
        if entry is None or job.runtime_estimate_s is None:
            return None
        devices, shadow = entry
        if math.isinf(shadow) or self.now + job.runtime_estimate_s > shadow:
            return None
        return devices

    def _soonest(self, job: PendingJob, flavor: str, n_devices: int, excluded: list[int]) -> list[int] | None:
        c = self.c
        req = job.request
        need_mem = req.memory_mib
        fraction = req.millis < MILLIS_PER_DEVICE
        per_replica = 1 if fraction else req.device_count
        now = self.now
        free_at = self.free_at
        best: tuple[tuple, list[int]] | None = None
        examined = 0
        for n in self._nodes_with(flavor):
            devs = c.node_devs[n][flavor]
            if len(devs) < n_devices or not self.placer.node_matches(n, job.node_selector):
                continue
            if c.node_cpu[n] < req.cpu_millicores * n_devices // max(1, per_replica) or (
                c.node_host_mem[n] < req.host_memory_mib * n_devices // max(1, per_replica)
            ):
                continue  # the node can never give the replica(s) their host CPU and memory
            ready = [
                (now if fraction and c.dev_free_millis[d] >= req.millis else free_at[d], d)
                for d in devs
                if c.dev_usable[d] and c.dev_held[d] is None and c.dev_mem[d] >= need_mem and d not in excluded
            ]
            if len(ready) < n_devices:
                continue
            ready.sort()
            pick = ready[:n_devices]
            free_now = sum(1 for _, d in pick if c.is_free(d))
            key = (pick[-1][0], -free_now, n)
            if best is None or key < best[0]:
                best = (key, [d for _, d in pick])
            examined += 1
            if examined >= MAX_NODES:
                break
        return None if best is None else best[1]

    def _nodes_with(self, flavor: str) -> list[int]:
        """Nodes with the flavor, those with the most free cards first (they are likely to be ready soonest)."""
        nodes = self._flavor_nodes.get(flavor)
        if nodes is None:
            c = self.c
            counts = c.node_free_whole.get(flavor, [])
            nodes = [n for n in range(len(c.node_name)) if flavor in c.node_devs[n]]
            nodes.sort(key=lambda n: (-counts[n] if counts else 0, n))
            self._flavor_nodes[flavor] = nodes
        return nodes

    def _ready_at(self, d: int, millis: int) -> float:
        c = self.c
        if millis < MILLIS_PER_DEVICE and c.dev_free_millis[d] >= millis:
            return self.now  # memory may still be short, but compute is free now
        return self.free_at[d]
