"""Writes of the fleet, one module per domain. Every state change is a function here, with keyword-only
arguments, in a transaction, with an audit record. Import from the module that owns the domain; this package
re-exports nothing.

Rooms:

- ``enrolment``: bootstrap tokens, an agent registering its node, node credentials (revoke, authenticate),
  and the close codes an agent socket is refused with.
- ``inventory``: an agent's ``hello`` (devices, flavors, health), a card moved to another node, reconciling
  the workloads an agent runs with the ones it should.
- ``lease``: heartbeats, disconnects, and ``lease_check`` (a silent node is lost; past the grace its jobs
  are requeued).
- ``agent_commands``: workload reports forwarded to the scheduler and applied; the commands agents fetch and
  acknowledge.
- ``rollups``: telemetry history: minute rows, hourly rollups, purge.
- ``notify``: what the fleet tells others after commit: an agent's socket (its channel group), the scheduler (a cycle).
"""
