"""Step 3, place (beside ``placement.py``): inference reservations, idle capacity a service holds for replicas it
may scale up to.

A ``Reservation`` row takes its capacity out of the free pool (``Cluster``). Two kinds of job may use it:

- the service itself (a pending job whose ``job_id`` is the service's): its new replicas go onto the
  reservation first (``Assignment.reservation_of`` = service). If preemptible training or batch work is
  sitting on it, that work is preempted (``RESERVATION_RECLAIM``) — at once, without the minimum runtime,
  because it only ever ran there on loan — and the service waits for it to stop;
- preemptible ``training`` or ``batch`` jobs that fit nowhere else: they run on the idle reservation, on
  the understanding that the service takes it back when it scales up.

Reservations are few, so this module scans them linearly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .capacity import Cluster
from .types import MILLIS_PER_DEVICE, Assignment, JobKind, PendingJob, Snapshot


@dataclass(slots=True)
class Slot:
    service: str
    d: int
    node: int
    millis: int
    memory_mib: int
    lent_millis: int = 0  # held by borrowers (running, or placed this cycle)
    lent_memory_mib: int = 0
    own_millis: int = 0  # taken by the service's own new replicas this cycle
    own_memory_mib: int = 0
    borrowers: list[str] = field(default_factory=list)

    def free(self, *, for_service: bool) -> tuple[int, int]:
        if for_service:  # what borrowers hold is the service's to take back
            return self.millis - self.own_millis, self.memory_mib - self.own_memory_mib
        return (
            self.millis - self.own_millis - self.lent_millis,
            self.memory_mib - self.own_memory_mib - self.lent_memory_mib,
        )

    def idle(self) -> bool:
        return self.lent_millis <= 0 and self.lent_memory_mib <= 0


class Reservations:
    def __init__(self, snapshot: Snapshot, cluster: Cluster) -> None:
        self.c = cluster
        self.slots: dict[str, list[Slot]] = {}
        self.scaling: set[str] = {j.job_id for j in snapshot.pending}  # services with pending replicas
        index: dict[tuple[str, int], Slot] = {}
        for res in sorted(snapshot.reservations, key=lambda r: (r.job_id, r.device_uuid)):
            d = cluster.dev_id.get(res.device_uuid)
            if d is None or not cluster.dev_usable[d]:
                continue
            slot = index.get((res.job_id, d))
            if slot is None:
                slot = Slot(res.job_id, d, cluster.dev_node[d], 0, 0)
                index[(res.job_id, d)] = slot
                self.slots.setdefault(res.job_id, []).append(slot)
            whole = res.millis >= MILLIS_PER_DEVICE
            slot.millis = min(MILLIS_PER_DEVICE, slot.millis + res.millis)
            slot.memory_mib = cluster.dev_mem[d] if whole else min(cluster.dev_mem[d], slot.memory_mib + res.memory_mib)
        on_loan = [a for a in snapshot.allocations if a.reservation_of is not None]
        for alloc in sorted(on_loan, key=lambda a: (a.job_id, a.replica, a.device_uuid)):
            d = cluster.dev_id.get(alloc.device_uuid)
            slot = index.get((alloc.reservation_of, d)) if d is not None else None
            if slot is None:
                continue
            whole = alloc.millis >= MILLIS_PER_DEVICE
            slot.lent_millis = min(slot.millis, slot.lent_millis + min(alloc.millis, MILLIS_PER_DEVICE))
            slot.lent_memory_mib = slot.memory_mib if whole else slot.lent_memory_mib + alloc.memory_mib
            if alloc.job_id not in slot.borrowers:
                slot.borrowers.append(alloc.job_id)

    def services(self) -> list[str]:
        return sorted(self.slots)

    def count(self, service: str, per_replica_devices: int) -> int:
        """Replicas' worth of reservation a service holds."""
        return len(self.slots.get(service, ())) // max(1, per_replica_devices)

    def place(
        self, *, job: PendingJob, flavor: str, count: int, first_replica: int, service: str
    ) -> tuple[list[Assignment], list[str]]:
        """Assign ``count`` replicas of ``job`` onto ``service``'s reservation, all or none.

        For the service itself, what borrowers hold counts as its own; if borrowers stand in the way they are
        returned (to be preempted) and nothing is assigned. A borrower gets only idle capacity, and only on a
        service that is not scaling up this cycle.
        """
        for_service = job.job_id == service
        if not for_service and (service in self.scaling or job.kind not in BORROWER_KINDS or not job.preemptible):
            return [], []
        req = job.request
        slots = [s for s in self.slots.get(service, ()) if self.c.dev_flavor[s.d] == flavor]
        out: list[Assignment] = []
        blockers: list[str] = []
        used: list[tuple[Slot, int, int]] = []
        host_taken: list[int] = []  # devices whose node gave the replica's host CPU and memory
        cpu, host_mem = req.cpu_millicores, req.host_memory_mib
        for i in range(count):
            pick = self._pick(slots, req.millis, req.memory_mib, for_service=for_service, host=(cpu, host_mem))
            if pick is None:
                break
            if cpu or host_mem:  # the reservation holds cards; the node's host resources are taken as usual
                self.c.take(pick[0][0].d, 0, 0, cpu, host_mem)
                host_taken.append(pick[0][0].d)
            for j, (slot, millis, memory) in enumerate(pick):
                if for_service:
                    free_millis, free_memory = slot.free(for_service=False)
                    if free_millis < millis or free_memory < memory:
                        blockers.extend(b for b in slot.borrowers if b not in blockers)
                    slot.own_millis += millis
                    slot.own_memory_mib += memory
                else:
                    slot.lent_millis += millis
                    slot.lent_memory_mib += memory
                used.append((slot, millis, memory))
                out.append(
                    Assignment(
                        replica=first_replica + i,
                        node=self.c.node_name[slot.node],
                        device_uuid=self.c.dev_uuid[slot.d],
                        millis=millis,
                        memory_mib=memory,
                        reservation_of=service,
                        cpu_millicores=cpu if j == 0 else 0,
                        host_memory_mib=host_mem if j == 0 else 0,
                    )
                )
        if blockers or len({a.replica for a in out}) < count:
            for d in host_taken:
                self.c.give(d, 0, 0, cpu, host_mem)
            for slot, millis, memory in used:  # all or none: undo
                if for_service:
                    slot.own_millis -= millis
                    slot.own_memory_mib -= memory
                else:
                    slot.lent_millis -= millis
                    slot.lent_memory_mib -= memory
            return [], blockers
        return out, []

    def _pick(self, slots: list[Slot], millis: int, memory_mib: int, *, for_service: bool, host=(0, 0)):
        host_fits = self.c.host_fits
        if millis < MILLIS_PER_DEVICE:
            for s in slots:
                free_millis, free_memory = s.free(for_service=for_service)
                if free_millis >= millis and free_memory >= memory_mib and host_fits(s.node, *host):
                    return [(s, millis, memory_mib)]
            return None
        n = millis // MILLIS_PER_DEVICE
        by_node: dict[int, list[Slot]] = {}
        for s in slots:
            free_millis, free_memory = s.free(for_service=for_service)
            if free_millis >= MILLIS_PER_DEVICE and free_memory >= s.memory_mib and s.memory_mib >= memory_mib:
                by_node.setdefault(s.node, []).append(s)
        for node, group in by_node.items():
            if len(group) >= n and host_fits(node, *host):
                return [(s, MILLIS_PER_DEVICE, s.memory_mib) for s in group[:n]]
        return None


BORROWER_KINDS = (JobKind.TRAINING, JobKind.BATCH)
