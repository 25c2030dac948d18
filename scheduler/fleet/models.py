"""The fleet: nodes, their cards and the command outbox to their agents; how a node proves who it is (bootstrap
tokens, node credentials), its connection and lease state, and the telemetry rollups that utilisation reports are
built on.

``Node``, ``Device`` and ``AgentCommand`` moved here from ``scheduler.models`` with their tables
(``scheduler_node``, ``scheduler_device``, ``scheduler_agentcommand``); jobs and allocations point at them.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from catalog.models import ResourceFlavor, Vendor


class NodeStatus(models.TextChoices):
    READY = "ready", _("ready")
    NOT_READY = "not_ready", _("not ready")
    CORDONED = "cordoned", _("cordoned")
    DRAINING = "draining", _("draining")


class Node(models.Model):
    name = models.CharField(max_length=128, unique=True)
    labels = models.JSONField(default=dict, blank=True)
    cpu_cores = models.PositiveIntegerField(default=0)
    memory_mib = models.PositiveBigIntegerField(default=0)
    status = models.CharField(max_length=16, choices=NodeStatus.choices, default=NodeStatus.NOT_READY)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    agent_version = models.CharField(max_length=32, blank=True, default="")
    # NUMA nodes, PCIe switches and NVLink peers as reported by the agent.
    topology = models.JSONField(default=dict, blank=True)
    # The address other nodes reach this one by (the agent's ``--address``, announced in its hello): what a
    # job's replicas on other nodes get as MASTER_ADDR and in their hostfile. Blank: agents before it (the node's
    # name is used).
    address = models.CharField(max_length=255, blank=True, default="")
    # The ports this node hands to jobs (the agent's ``--job-ports``, announced in its hello); null: the portal's
    # GPUPOOL_JOB_PORT_RANGE.
    job_port_first = models.PositiveIntegerField(null=True, blank=True)
    job_port_last = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "scheduler_node"  # the table kept its name when the fleet took the model over
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def reachable_address(self) -> str:
        """The address a job's peers use for this node: the announced one, else its name."""
        return self.address or self.name


class DeviceHealth(models.TextChoices):
    HEALTHY = "healthy", _("healthy")
    DEGRADED = "degraded", _("degraded")
    UNHEALTHY = "unhealthy", _("unhealthy")


class Device(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="devices")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=96, unique=True)
    vendor = models.CharField(max_length=16, choices=Vendor.choices)
    model = models.CharField(max_length=64)
    flavor = models.ForeignKey(ResourceFlavor, null=True, blank=True, on_delete=models.PROTECT, related_name="devices")
    memory_mib = models.PositiveIntegerField()
    numa_node = models.SmallIntegerField(null=True, blank=True)
    pci_bus_id = models.CharField(max_length=32, blank=True, default="")
    health = models.CharField(max_length=16, choices=DeviceHealth.choices, default=DeviceHealth.HEALTHY)
    mig_mode = models.BooleanField(default=False)
    # Cards sharing a value are NVLink-connected / behind one PCIe switch (from the agent's hello); blank = none.
    nvlink_domain = models.CharField(max_length=64, blank=True, default="")
    pcie_switch = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        db_table = "scheduler_device"
        ordering = ["node__name", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="device_unique_node_index")]

    def __str__(self) -> str:
        return f"{self.node.name}/{self.index}"


class AgentCommandQuerySet(models.QuerySet):
    def unacked(self) -> AgentCommandQuerySet:
        return self.filter(acked_at__isnull=True)

    def undelivered(self) -> AgentCommandQuerySet:
        return self.filter(sent_at__isnull=True)


class AgentCommand(models.Model):
    """Outbox of portal → agent commands (``workload.start``, ``workload.stop``, ``config``).

    Written in the same transaction as the decision that needs it; announced to the node's agent consumer
    (group ``agent.node.<node id>``) only after commit. ``payload`` is a protocol frame dict
    (``nodeagent.protocol.to_dict``) whose ``command_id`` is this row's pk. The consumer sets ``sent_at``
    when it sends, ``acked_at`` (and ``ack_ok``/``error``) on the agent's ``ack``, and resends every unacked
    command on reconnect.
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="commands")
    job = models.ForeignKey("scheduler.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="commands")
    command_type = models.CharField(max_length=32)
    payload = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    acked_at = models.DateTimeField(null=True, blank=True)
    ack_ok = models.BooleanField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True, default="")
    attempts = models.PositiveIntegerField(default=0)

    objects = AgentCommandQuerySet.as_manager()

    class Meta:
        db_table = "scheduler_agentcommand"
        ordering = ["id"]
        indexes = [models.Index(fields=["node", "acked_at"], name="agentcommand_node_unacked")]

    def __str__(self) -> str:
        return f"{self.command_type} #{self.pk} → {self.node_id}"


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
    """What the portal knows about a node's agent beyond its ``Node``: host name, connection times and
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
