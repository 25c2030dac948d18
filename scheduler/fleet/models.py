"""The portal side of the node agents: how a node proves who it is (bootstrap tokens, node credentials), its
connection and lease state, and the telemetry rollups that utilisation reports are built on.

Node, Device and ResourceFlavor belong to ``scheduler.models``; this app only adds rows beside them.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from scheduler.models import Device, Node


class BootstrapToken(models.Model):
    """A one-time, expiring secret a system admin hands to a new node; ``gpupool-agent register`` trades it
    for a per-node credential. Only the SHA-256 of the secret is stored."""

    token_hash = models.CharField(max_length=64, unique=True)
    # The first characters of the secret, so an admin can tell tokens apart in a list without the secret.
    prefix = models.CharField(max_length=16)
    description = models.CharField(max_length=200, blank=True, default="")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    used_by_node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… (expires {self.expires_at:%Y-%m-%d %H:%M})"


class NodeCredential(models.Model):
    """The secret a registered node's agent authenticates its WebSocket with. Revocable; hashed.

    The credential string is ``gpn_<key_id>_<secret>``: ``key_id`` finds the row, the secret is compared with
    ``secret_hash`` in constant time.
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="credentials")
    key_id = models.CharField(max_length=24, unique=True)
    secret_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.node.name}:{self.key_id}"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class NodeAgent(models.Model):
    """What the portal knows about a node's agent beyond ``scheduler.Node``: host name, connection times and
    the lease state (when the node was declared lost and whether its jobs were requeued)."""

    node = models.OneToOneField(Node, on_delete=models.CASCADE, related_name="agent", primary_key=True)
    hostname = models.CharField(max_length=255, blank=True, default="")
    connected_at = models.DateTimeField(null=True, blank=True)
    disconnected_at = models.DateTimeField(null=True, blank=True)
    # Set when the lease expired (missed heartbeats); cleared when the agent is back.
    lost_at = models.DateTimeField(null=True, blank=True)
    jobs_requeued_at = models.DateTimeField(null=True, blank=True)
    #: How the agent confines workloads, from its hello: ``namespaces`` (each workload in its own uid,
    #: namespaces and cgroups), ``none`` (unconfined: a development agent), ``""`` (an agent before the sandbox).
    sandbox = models.CharField(max_length=16, blank=True, default="")
    #: How the agent keeps other tenants' jobs from a job's sockets (``nodeagent.netpolicy``): ``nftables``,
    #: ``none``, ``""`` (an agent before it).
    network_isolation = models.CharField(max_length=16, blank=True, default="")

    def __str__(self) -> str:
        return f"agent of {self.node_id}"


class TelemetryRollup(models.Model):
    """Aggregates of one device over one period. ``samples`` lets two partial rows of the same period (an
    agent that reconnected mid-minute) be merged into a correct weighted average."""

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="+")
    samples = models.PositiveIntegerField()
    utilization_avg_pct = models.FloatField()
    utilization_max_pct = models.FloatField()
    memory_used_avg_mib = models.FloatField()
    memory_used_max_mib = models.FloatField()
    power_avg_w = models.FloatField(null=True, blank=True)
    temperature_max_c = models.FloatField(null=True, blank=True)

    class Meta:
        abstract = True


class TelemetryMinute(TelemetryRollup):
    """Per-minute rollup, kept ``GPUPOOL_TELEMETRY_MINUTE_RETENTION_DAYS`` (30) days."""

    minute = models.DateTimeField()

    class Meta:
        ordering = ["minute"]
        constraints = [models.UniqueConstraint(fields=["device", "minute"], name="telemetry_minute_unique")]
        indexes = [models.Index(fields=["minute"], name="telemetry_minute_time")]


class TelemetryHour(TelemetryRollup):
    """Per-hour rollup built from the minutes, kept ``GPUPOOL_TELEMETRY_HOUR_RETENTION_DAYS`` (365) days."""

    hour = models.DateTimeField()

    class Meta:
        ordering = ["hour"]
        constraints = [models.UniqueConstraint(fields=["device", "hour"], name="telemetry_hour_unique")]
        indexes = [models.Index(fields=["hour"], name="telemetry_hour_time")]


class AgentReport(models.Model):
    """A workload status report of a node's agent that the portal applied, by the agent's report id.

    Written in the transaction that applies the report, so a report whose ack was lost and that the agent sends
    again is recognised and acked without being applied twice; a report whose transaction rolled back left no
    row and is applied when it comes again. Kept ``GPUPOOL_AGENT_REPORT_RETENTION_DAYS`` (30) days.
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+")
    report_id = models.BigIntegerField()
    # Plain ids, not foreign keys: the row records what the agent said, whatever became of the job.
    job_id = models.BigIntegerField()
    replica = models.PositiveSmallIntegerField()
    state = models.CharField(max_length=16)
    #: What applying it came to: "applied", or why it changed nothing ("unknown_job", "not_allocated", ...).
    outcome = models.CharField(max_length=32, default="applied")
    received_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "report_id"], name="agent_report_unique")]
        indexes = [models.Index(fields=["received_at"], name="agent_report_received")]

    def __str__(self) -> str:
        return f"report {self.report_id} of node {self.node_id}: job {self.job_id} {self.state}"
