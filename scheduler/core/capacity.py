"""Free capacity of the cluster, indexed so that a placement never scans every device.

Devices and nodes are numbered (ints) once per cycle; all per-device state lives in flat lists. Two indices
per flavor keep the lookups cheap:

- ``frac[flavor][b]``: partially used, shareable devices whose free millis fall in bucket ``b``
  (``free // 100``, 1..9). Best fit scans buckets upwards from the request; a bucket is a dict used as an
  insertion-ordered set, so iteration order (and so the plan) is deterministic.
- ``whole[flavor][k]``: nodes with exactly ``k`` fully free devices of the flavor (k >= 1). A multi-card
  request scans k upwards (best fit: the node with the fewest free cards that still has enough).

Host CPU (millicores) and host memory (MiB) are kept per node (``node_free_cpu``, ``node_free_host_mem``); a
replica's host resources are taken with its first card, on the same node, and a node that does not state
them has ``UNLIMITED``. The indices are about cards only: a placement skips a card whose node lacks the host
resources beside it.

Only usable devices (healthy, on a schedulable node) are indexed. A device can be *held* (kept out of the
indices) for a job that waits for preemption or a queue head with capacity reserved for it.
Every change goes through ``take``/``give``/``hold``/``release`` and can be undone in reverse order, which
is how gang placement and the preemption search try things out.
"""

from __future__ import annotations

from collections.abc import Mapping

from .types import FRACTION_STEP_MILLIS, MILLIS_PER_DEVICE, UNLIMITED, Snapshot

_BUCKETS = MILLIS_PER_DEVICE // FRACTION_STEP_MILLIS  # 10: fully free


def bucket_of(free_millis: int) -> int:
    return free_millis // FRACTION_STEP_MILLIS


class Cluster:
    """Mutable free-capacity view built from a snapshot; see the module docstring."""

    __slots__ = (
        "_max_k",
        "capacity_millis",
        "dev_flavor",
        "dev_free_mem",
        "dev_free_millis",
        "dev_held",
        "dev_id",
        "dev_index",
        "dev_mem",
        "dev_node",
        "dev_numa",
        "dev_nvlink",
        "dev_pcie",
        "dev_usable",
        "dev_uuid",
        "frac",
        "max_group",
        "node_busy",
        "node_cpu",
        "node_devs",
        "node_free_cpu",
        "node_free_host_mem",
        "node_free_whole",
        "node_host_mem",
        "node_id",
        "node_labels",
        "node_name",
        "whole",
    )

    def __init__(self, snapshot: Snapshot) -> None:
        self.dev_uuid: list[str] = []
        self.dev_node: list[int] = []
        self.dev_index: list[int] = []
        self.dev_flavor: list[str] = []
        self.dev_mem: list[int] = []
        self.dev_free_millis: list[int] = []
        self.dev_free_mem: list[int] = []
        self.dev_usable: list[bool] = []
        self.dev_held: list[str | None] = []
        self.dev_nvlink: list[str | None] = []
        self.dev_pcie: list[str | None] = []
        self.dev_numa: list[int | None] = []
        self.dev_id: dict[str, int] = {}
        self.node_name: list[str] = []
        self.node_id: dict[str, int] = {}
        self.node_labels: list[Mapping[str, str]] = []
        # node -> flavor -> device ids (in index order)
        self.node_devs: list[dict[str, list[int]]] = []
        self.node_free_whole: dict[str, list[int]] = {}
        self.node_busy: list[int] = []  # devices of the node with anything allocated
        self.node_cpu: list[int] = []  # allocatable host CPU millicores (UNLIMITED when not stated)
        self.node_host_mem: list[int] = []
        self.node_free_cpu: list[int] = []
        self.node_free_host_mem: list[int] = []
        self.capacity_millis: dict[str, int] = {}  # usable millis per flavor
        self._max_k: dict[str, int] = {}
        # Per flavor, the most cards of one node sharing an NVLink domain, a PCIe switch, a NUMA node.
        self.max_group: dict[str, tuple[int, int, int]] = {}
        group_sizes: dict[tuple[int, int, str, object], int] = {}

        for node in sorted(snapshot.nodes, key=lambda n: n.name):
            n = len(self.node_name)
            self.node_name.append(node.name)
            self.node_id[node.name] = n
            self.node_labels.append(node.labels)
            self.node_busy.append(0)
            cpu = UNLIMITED if node.cpu_millicores is None else node.cpu_millicores
            host_mem = UNLIMITED if node.host_memory_mib is None else node.host_memory_mib
            self.node_cpu.append(cpu)
            self.node_host_mem.append(host_mem)
            self.node_free_cpu.append(cpu)
            self.node_free_host_mem.append(host_mem)
            per_flavor: dict[str, list[int]] = {}
            self.node_devs.append(per_flavor)
            for dev in sorted(node.devices, key=lambda d: (d.index, d.uuid)):
                d = len(self.dev_uuid)
                self.dev_uuid.append(dev.uuid)
                self.dev_id[dev.uuid] = d
                self.dev_node.append(n)
                self.dev_index.append(dev.index)
                self.dev_flavor.append(dev.flavor)
                self.dev_mem.append(dev.memory_mib)
                self.dev_free_millis.append(MILLIS_PER_DEVICE)
                self.dev_free_mem.append(dev.memory_mib)
                usable = dev.healthy and node.schedulable
                self.dev_usable.append(usable)
                self.dev_held.append(None)
                self.dev_nvlink.append(dev.nvlink_domain)
                self.dev_pcie.append(dev.pcie_switch)
                self.dev_numa.append(dev.numa_node)
                per_flavor.setdefault(dev.flavor, []).append(d)
                for level, value in ((0, dev.nvlink_domain), (1, dev.pcie_switch), (2, dev.numa_node)):
                    if value is not None:
                        key = (n, level, dev.flavor, value)
                        group_sizes[key] = group_sizes.get(key, 0) + 1
                if usable:
                    self.capacity_millis[dev.flavor] = self.capacity_millis.get(dev.flavor, 0) + MILLIS_PER_DEVICE

        maxima: dict[str, list[int]] = {}
        for (_, level, flavor, _), size in group_sizes.items():
            top = maxima.setdefault(flavor, [0, 0, 0])
            top[level] = max(top[level], size)
        self.max_group = {flavor: (top[0], top[1], top[2]) for flavor, top in maxima.items()}

        # Existing allocations and reservations take capacity before the indices are built.
        reserved = {(res.job_id, res.device_uuid) for res in snapshot.reservations}
        for alloc in snapshot.allocations:
            d = self.dev_id.get(alloc.device_uuid)
            if d is None or (alloc.reservation_of, alloc.device_uuid) in reserved:
                # Unknown device (node gone): nothing to free. On a reservation: the reservation already
                # counts that capacity (below); on one that is gone, the allocation counts for itself.
                continue
            self._consume(d, alloc.millis, alloc.memory_mib)
            if alloc.cpu_millicores or alloc.host_memory_mib:
                n = self.dev_node[d]
                self.node_free_cpu[n] -= alloc.cpu_millicores
                self.node_free_host_mem[n] -= alloc.host_memory_mib
        for res in snapshot.reservations:
            d = self.dev_id.get(res.device_uuid)
            if d is not None:
                self._consume(d, res.millis, res.memory_mib)

        self.frac: dict[str, list[dict[int, None]]] = {}
        self.whole: dict[str, list[dict[int, None]]] = {}
        for flavor in sorted({f for f in self.dev_flavor}):
            self.frac[flavor] = [{} for _ in range(_BUCKETS + 1)]
            max_k = max((len(per.get(flavor, ())) for per in self.node_devs), default=0)
            self._max_k[flavor] = max_k
            self.whole[flavor] = [{} for _ in range(max_k + 1)]
            self.node_free_whole[flavor] = [0] * len(self.node_name)
        for d in range(len(self.dev_uuid)):
            if self.dev_usable[d]:
                self._index_add(d)

    # -- raw state -------------------------------------------------------------------------------------------

    def _consume(self, d: int, millis: int, memory_mib: int) -> None:
        was_free = self.dev_free_millis[d] == MILLIS_PER_DEVICE and self.dev_free_mem[d] == self.dev_mem[d]
        if millis >= MILLIS_PER_DEVICE:
            self.dev_free_millis[d] = 0
            self.dev_free_mem[d] = 0
        else:
            self.dev_free_millis[d] = max(0, self.dev_free_millis[d] - millis)
            self.dev_free_mem[d] = max(0, self.dev_free_mem[d] - memory_mib)
        if was_free and not self.is_free(d):
            self.node_busy[self.dev_node[d]] += 1

    def is_free(self, d: int) -> bool:
        return self.dev_free_millis[d] == MILLIS_PER_DEVICE and self.dev_free_mem[d] == self.dev_mem[d]

    def indexed(self, d: int) -> bool:
        return self.dev_usable[d] and self.dev_held[d] is None

    # -- indices ---------------------------------------------------------------------------------------------

    def _index_add(self, d: int) -> None:
        flavor = self.dev_flavor[d]
        if self.is_free(d):
            n = self.dev_node[d]
            counts = self.node_free_whole[flavor]
            k = counts[n]
            buckets = self.whole[flavor]
            if k:
                del buckets[k][n]
            counts[n] = k + 1
            buckets[k + 1][n] = None
        else:
            b = bucket_of(self.dev_free_millis[d])
            if b > 0 and self.dev_free_mem[d] > 0:
                self.frac[flavor][b][d] = None

    def _index_remove(self, d: int) -> None:
        flavor = self.dev_flavor[d]
        if self.is_free(d):
            n = self.dev_node[d]
            counts = self.node_free_whole[flavor]
            k = counts[n]
            buckets = self.whole[flavor]
            del buckets[k][n]
            counts[n] = k - 1
            if k > 1:
                buckets[k - 1][n] = None
        else:
            b = bucket_of(self.dev_free_millis[d])
            if b > 0:
                self.frac[flavor][b].pop(d, None)

    # -- changes (each has an inverse) -----------------------------------------------------------------------

    def host_fits(self, n: int, cpu_millicores: int, host_memory_mib: int) -> bool:
        """Node ``n`` has ``cpu_millicores`` CPU and ``host_memory_mib`` host memory free."""
        return self.node_free_cpu[n] >= cpu_millicores and self.node_free_host_mem[n] >= host_memory_mib

    def take(self, d: int, millis: int, memory_mib: int, cpu_millicores: int = 0, host_memory_mib: int = 0) -> None:
        """Allocate on device ``d`` (and host CPU and memory on its node); whole-card requests (>= 1000 millis)
        take the card exclusively."""
        free_millis = self.dev_free_millis[d]
        if millis > free_millis or memory_mib > self.dev_free_mem[d]:
            raise AssertionError(f"over-allocating device {self.dev_uuid[d]}")  # a bug in the engine
        if cpu_millicores or host_memory_mib:
            n = self.dev_node[d]
            if not self.host_fits(n, cpu_millicores, host_memory_mib):
                raise AssertionError(f"over-allocating host of node {self.node_name[n]}")  # a bug in the engine
            self.node_free_cpu[n] -= cpu_millicores
            self.node_free_host_mem[n] -= host_memory_mib
        indexed = self.indexed(d)
        if indexed:
            self._index_remove(d)
        if self.is_free(d):
            self.node_busy[self.dev_node[d]] += 1
        self.dev_free_millis[d] = free_millis - millis
        self.dev_free_mem[d] -= memory_mib
        if indexed:
            self._index_add(d)

    def give(self, d: int, millis: int, memory_mib: int, cpu_millicores: int = 0, host_memory_mib: int = 0) -> None:
        """Return capacity to device ``d`` (undo of ``take``; also a victim's capacity in a what-if)."""
        if cpu_millicores or host_memory_mib:
            n = self.dev_node[d]
            self.node_free_cpu[n] += cpu_millicores
            self.node_free_host_mem[n] += host_memory_mib
        indexed = self.indexed(d)
        if indexed:
            self._index_remove(d)
        self.dev_free_millis[d] = min(MILLIS_PER_DEVICE, self.dev_free_millis[d] + millis)
        self.dev_free_mem[d] = min(self.dev_mem[d], self.dev_free_mem[d] + memory_mib)
        if self.is_free(d):
            self.node_busy[self.dev_node[d]] -= 1
        if indexed:
            self._index_add(d)

    def hold(self, d: int, job_id: str) -> None:
        """Keep device ``d`` out of every index: its free capacity is kept for ``job_id``."""
        if self.dev_held[d] is None and self.dev_usable[d]:
            self._index_remove(d)
        self.dev_held[d] = job_id

    def release(self, d: int) -> None:
        if self.dev_held[d] is not None:
            self.dev_held[d] = None
            if self.dev_usable[d]:
                self._index_add(d)

    # -- queries ---------------------------------------------------------------------------------------------

    def max_free_whole(self, flavor: str) -> int:
        """The most fully free devices of ``flavor`` on any one node."""
        buckets = self.whole.get(flavor)
        if not buckets:
            return 0
        for k in range(len(buckets) - 1, 0, -1):
            if buckets[k]:
                return k
        return 0

    def has_flavor(self, flavor: str) -> bool:
        return self.capacity_millis.get(flavor, 0) > 0

    def max_devices_per_node(self, flavor: str) -> int:
        return self._max_k.get(flavor, 0)
