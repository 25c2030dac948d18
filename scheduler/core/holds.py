"""Step 4, holds: the capacity a preemption frees is kept for its preemptor across cycles (``types.Hold``).

A preemption plans a job's start for a later cycle: its victims get a grace period to checkpoint, so the
devices they free are not free in the cycle that preempts. Holding them for one cycle only is not enough —
when the victims finally stop, any job ahead of the preemptor in the next cycle's order (often the requeued
victim itself) takes the freed capacity, and the preemptor preempts again: a loop (the simulator measured
4,366 preemptions in a Philly week without a lasting hold, against 331 with one). So a plan returns its
holds and the caller feeds them back into the next snapshot:

- a held device is out of every index (``Cluster.hold``) for everybody but its preemptor, so no other job is
  placed on it, backfilled onto it or reserves it as a queue head;
- the preemptor is placed as soon as it fits (on its held devices or anywhere else); until then, while any of
  its victims still has an allocation, it waits and searches for no new victims, and its victims are not
  candidates for anybody else's preemption (they are already stopping);
- once its victims are gone and it still does not fit (a node failed, say), the hold is dropped and the job
  is scheduled like any other, which may preempt again.

A hold on a device of the preemptor's own inference reservation (an inference service reclaiming it from
borrowers) leaves the cluster alone — the reservation already keeps that capacity from others — and only
records which borrowers the service waits for.
"""

from __future__ import annotations

from collections.abc import Iterable

from .capacity import Cluster
from .types import Hold, Snapshot


class Holds:
    def __init__(self, snapshot: Snapshot, cluster: Cluster) -> None:
        self.c = cluster
        self.now = snapshot.now
        self.running = {a.job_id for a in snapshot.allocations}
        self.reserved = {(r.job_id, r.device_uuid) for r in snapshot.reservations}
        pending = {j.job_id for j in snapshot.pending}
        self.by_job: dict[str, list[tuple[int, Hold]]] = {}
        for hold in sorted(snapshot.holds, key=lambda h: (h.job_id, h.device_uuid)):
            d = cluster.dev_id.get(hold.device_uuid)
            if d is None or hold.job_id not in pending:
                continue  # the device or the preemptor is gone: the hold goes too
            if not self._on_reservation(hold.job_id, hold.device_uuid):
                if cluster.dev_held[d] is not None:
                    continue  # two preemptors on one device (inconsistent input): the first keeps it
                cluster.hold(d, hold.job_id)
            self.by_job.setdefault(hold.job_id, []).append((d, hold))
        # Victims that are still stopping: nobody preempts them again.
        self.stopping = frozenset(
            v for held in self.by_job.values() for _, hold in held for v in hold.victims if v in self.running
        )
        self.out: list[Hold] = []
        # Per device, the jobs that hold it in ``out`` (not a scan of ``out`` per new hold: quadratic at scale).
        self._out_jobs: dict[str, set[str]] = {}

    def _carry(self, hold: Hold) -> None:
        self.out.append(hold)
        self._out_jobs.setdefault(hold.device_uuid, set()).add(hold.job_id)

    def _on_reservation(self, job_id: str, device_uuid: str) -> bool:
        return (job_id, device_uuid) in self.reserved

    def take(self, job_id: str) -> list[tuple[int, Hold]]:
        """The job's holds, its devices released so that it (or, if it stops waiting, anyone) may use them."""
        held = self.by_job.pop(job_id, [])
        for d, hold in held:
            if not self._on_reservation(job_id, hold.device_uuid):
                self.c.release(d)
        return held

    def waiting_for(self, held: list[tuple[int, Hold]]) -> tuple[str, ...]:
        """Victims of these holds that still have allocations."""
        return tuple(sorted({v for _, hold in held for v in hold.victims if v in self.running}))

    def keep(self, job_id: str, held: list[tuple[int, Hold]], victims: tuple[str, ...]) -> None:
        """The job still waits for ``victims``: hold its devices again and carry the holds to the next cycle."""
        for d, hold in held:
            if not self._on_reservation(job_id, hold.device_uuid):
                self.c.hold(d, job_id)
            self._carry(Hold(job_id, hold.device_uuid, victims, hold.since))

    def add(self, job_id: str, devices: Iterable[int], victims: Iterable[str]) -> None:
        """New holds for a preemption planned now (the caller has already taken the devices out of the pool)."""
        names = tuple(sorted(set(victims)))
        for d in sorted(set(devices)):
            uuid = self.c.dev_uuid[d]
            owners = self._out_jobs.get(uuid, ())
            if not any(owner != job_id for owner in owners):  # one preemptor per device (a shared card: the first)
                self._carry(Hold(job_id, uuid, names, self.now))

    def result(self) -> tuple[Hold, ...]:
        """Holds for the next snapshot: those made or kept this cycle, and those of jobs not looked at."""
        untouched = [hold for held in self.by_job.values() for _, hold in held]
        return tuple(sorted(self.out + untouched, key=lambda h: (h.job_id, h.device_uuid)))
