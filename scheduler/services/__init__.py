"""Writes for jobs, nodes, flavors and the scheduling cycle, one module per domain. Every state change goes
through a function here. Import from the module that owns the domain; this package re-exports nothing.

Job states move only through ``transitions.job_transition``, which checks the transition is allowed, writes a
``JobEvent`` and an audit record in the caller's transaction. Commands to agents go through
``scheduler.fleet.outbox`` (rows now, announcements after commit).

Rooms:

- ``transitions``: the allowed job state changes and ``job_transition``; ending allocations, requeueing,
  releasing an inference service's reservations. Imports no other service module.
- ``jobs``: submit one job (tenant, admission, rows, events), cancel it, release or reject it when its
  admission request is decided.
- ``arrays``: job arrays: submit many copies in bulk, cancel an array.
- ``scaling``: inference services: replica bounds, the replicas a load asks for, scale up and down.
- ``reports``: agents' workload reports, the requeue of a lost node's jobs, the sweeps for stops that were
  never confirmed.
- ``nodes``: cordon, drain and uncordon nodes; resource flavors.
- ``cycle``: request a scheduling cycle (``request_cycle``), run requested cycles, ``run_cycle`` itself.
  Imports no other service module; the others ask it for cycles.
"""
