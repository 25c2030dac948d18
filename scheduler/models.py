"""Resources (nodes, devices), the work placed on them (jobs, allocations) and the outbox of commands to node
agents. The flavors of devices live below, in ``catalog``, since the tenants' quotas are per flavor too.

Invariants the database helps keep (see ``Allocation``): per device, the active allocations never exceed
1000 millis or the device's memory; a whole-card (1000 millis) allocation therefore excludes every other.
"""

from __future__ import annotations

from django.conf import settings
from django.core.files.storage import storages
from django.db import models
from django.utils.translation import gettext_lazy as _

from catalog.models import ResourceFlavor
from scheduler.core.types import MILLIS_PER_DEVICE, MIN_FRACTION_MILLIS
from scheduler.core.types import PriorityClass as CorePriority
from scheduler.fleet.models import Device, Node


def _outputs_storage():
    """The ``outputs`` storage of ``STORAGES`` (a callable, so migrations do not record the deployment's choice)."""
    return storages["outputs"]


# --- jobs ---------------------------------------------------------------------------------------------


class JobKind(models.TextChoices):
    TRAINING = "training", _("training")
    INFERENCE = "inference", _("inference")
    INTERACTIVE = "interactive", _("interactive")
    BATCH = "batch", _("batch")


class PriorityClass(models.IntegerChoices):
    """Named priority classes (the value is the priority; higher wins): ``scheduler.core``'s, with labels."""

    CRITICAL = int(CorePriority.CRITICAL), _("critical")
    HIGH = int(CorePriority.HIGH), _("high")
    NORMAL = int(CorePriority.NORMAL), _("normal")
    LOW = int(CorePriority.LOW), _("low")
    BEST_EFFORT = int(CorePriority.BEST_EFFORT), _("best effort")


class TopologyConstraint(models.TextChoices):
    NONE = "none", _("none")
    SAME_NODE = "same_node", _("all replicas on one node")
    NVLINK = "nvlink", _("one NVLink domain per replica")
    NUMA = "numa", _("one NUMA node per replica")


class JobState(models.TextChoices):
    SUBMITTED = "submitted", _("submitted")
    PENDING_APPROVAL = "pending_approval", _("pending approval")
    QUEUED = "queued", _("queued")
    ADMITTED = "admitted", _("admitted")
    RUNNING = "running", _("running")
    PREEMPTING = "preempting", _("preempting")
    SUCCEEDED = "succeeded", _("succeeded")
    FAILED = "failed", _("failed")
    CANCELLED = "cancelled", _("cancelled")
    NODE_LOST = "node_lost", _("node lost")


#: States in which a job holds (or is about to hold) devices.
ACTIVE_JOB_STATES = frozenset({JobState.ADMITTED, JobState.RUNNING, JobState.PREEMPTING})
#: States a cycle looks at to place.
PENDING_JOB_STATES = frozenset({JobState.QUEUED, JobState.PENDING_APPROVAL})
FINAL_JOB_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


class Job(models.Model):
    """A unit of work: ``replicas`` (a gang: all or none) times one per-replica request.

    The per-replica request is either a fraction of one card (``millis_per_replica`` 100..990 and
    ``memory_mib_per_replica``) or N whole cards (``millis_per_replica`` = N * 1000, exclusive).
    """

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="jobs")
    submitter = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs"
    )
    name = models.CharField(max_length=128)
    kind = models.CharField(max_length=16, choices=JobKind.choices, default=JobKind.TRAINING)
    priority_class = models.IntegerField(choices=PriorityClass.choices, default=PriorityClass.NORMAL)
    preemptible = models.BooleanField(default=True)
    # Gang size: all replicas start together or none does. Inference: the replicas wanted now.
    replicas = models.PositiveSmallIntegerField(default=1)
    min_replicas = models.PositiveSmallIntegerField(null=True, blank=True)
    max_replicas = models.PositiveSmallIntegerField(null=True, blank=True)
    # Flavor names, any of them, in order of preference (validated against ResourceFlavor at submit).
    flavors = models.JSONField(default=list)
    # True: the flavors are alternatives, not a preference — the scheduler picks the one where the job borrows,
    # then fragments, the least (``resources.any_flavor`` in the spec).
    any_flavor = models.BooleanField(default=False, db_default=False)
    millis_per_replica = models.PositiveIntegerField()
    memory_mib_per_replica = models.PositiveIntegerField(default=0)
    cpu_millicores_per_replica = models.PositiveIntegerField(default=0)
    host_memory_mib_per_replica = models.PositiveIntegerField(default=0)
    topology = models.CharField(max_length=16, choices=TopologyConstraint.choices, default=TopologyConstraint.NONE)
    node_selector = models.JSONField(default=dict, blank=True)
    command = models.JSONField(default=list)
    env = models.JSONField(default=dict, blank=True)
    working_dir = models.CharField(max_length=1024, blank=True, default="")
    max_runtime_s = models.PositiveIntegerField(null=True, blank=True)
    checkpoint_dir = models.CharField(max_length=1024, blank=True, default="")
    runtime_estimate_s = models.PositiveIntegerField(null=True, blank=True)
    # The spec as submitted (validated, normalised), for reproducing the job.
    spec = models.JSONField(default=dict, blank=True)
    # Set on the jobs of one array submit (``"array": {"count": N}``): the batch's id, shared by its N
    # independent jobs, and this job's index 0..N-1 (also in its env as GPUPOOL_ARRAY_INDEX).
    array_id = models.UUIDField(null=True, blank=True, db_index=True)
    array_index = models.PositiveIntegerField(null=True, blank=True)

    state = models.CharField(max_length=20, choices=JobState.choices, default=JobState.SUBMITTED, db_index=True)
    state_message = models.CharField(max_length=500, blank=True, default="")
    exit_code = models.IntegerField(null=True, blank=True)
    # Written by each scheduling cycle while the job waits (codes: scheduler.core.types.PendingReason).
    pending_reason_code = models.CharField(max_length=40, blank=True, default="")
    pending_message = models.CharField(max_length=500, blank=True, default="")
    position_in_tenant = models.PositiveIntegerField(null=True, blank=True)
    position_overall = models.PositiveIntegerField(null=True, blank=True)
    # Ids of jobs that preempted this one: it never preempts them back (no preemption loops).
    preempted_by = models.JSONField(default=list, blank=True)
    preemption_count = models.PositiveIntegerField(default=0)
    # Inference: replicas told to stop on scale-down; when their stop is confirmed their capacity becomes
    # the service's reservation instead of failing the job.
    scaling_down_replicas = models.JSONField(default=list, blank=True)
    last_checkpoint_at = models.DateTimeField(null=True, blank=True)

    submitted_at = models.DateTimeField(auto_now_add=True, db_index=True)
    queued_at = models.DateTimeField(null=True, blank=True)
    admitted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    # The client's ``Idempotency-Key`` header on submit: a retried submit with the same key (same submitter)
    # returns the job it created the first time instead of a second one. Empty when none was sent.
    idempotency_key = models.CharField(max_length=128, blank=True, default="")
    # When a pending job is expected to start (forward simulation of the live snapshot), with a p10..p90 band;
    # ``estimated_at`` says when that estimate was made. Null when no estimate is known.
    estimated_start_at = models.DateTimeField(null=True, blank=True)
    estimated_start_p10_at = models.DateTimeField(null=True, blank=True)
    estimated_start_p90_at = models.DateTimeField(null=True, blank=True)
    estimated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-submitted_at", "-id"]
        indexes = [models.Index(fields=["tenant", "state"], name="job_tenant_state")]
        constraints = [
            models.UniqueConstraint(
                fields=["submitter", "idempotency_key"],
                condition=~models.Q(idempotency_key=""),
                name="job_idempotency_key_per_submitter",
            ),
            # A task of an array is one job at most, however many cycles and users race to make it one.
            models.UniqueConstraint(
                fields=["array_id", "array_index"],
                condition=models.Q(array_id__isnull=False),
                name="job_array_task_once",
            ),
            models.CheckConstraint(condition=models.Q(replicas__gte=1), name="job_replicas_positive"),
            models.CheckConstraint(
                condition=models.Q(millis_per_replica__gte=MIN_FRACTION_MILLIS), name="job_millis_at_least_min"
            ),
        ]

    def __str__(self) -> str:
        return f"job {self.pk} {self.name}"

    @property
    def total_millis(self) -> int:
        return self.replicas * self.millis_per_replica

    @property
    def fractional(self) -> bool:
        return self.millis_per_replica < MILLIS_PER_DEVICE

    @property
    def devices_per_replica(self) -> int:
        return 1 if self.fractional else self.millis_per_replica // MILLIS_PER_DEVICE


class JobArray(models.Model):
    """An array submit (``"array": {"count": N}``), kept as Slurm keeps one: task 0 (``head``) is a job row from
    the start; the other tasks become job rows only when a scheduling cycle may place them
    (``scheduler.services.arrays.array_tasks_top_up``) or a user asks for one by index. Until then they are the
    index ranges of ``unmaterialized``, all queued, all copies of the head but for ``GPUPOOL_ARRAY_INDEX``.
    """

    array_id = models.UUIDField(primary_key=True)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="job_arrays")
    head = models.OneToOneField(Job, on_delete=models.CASCADE, related_name="array_record")
    count = models.PositiveIntegerField()
    #: The task indices that are not job rows yet, as sorted disjoint ``[start, end)`` ranges.
    unmaterialized = models.JSONField(default=list, blank=True)
    #: How many indices ``unmaterialized`` holds (what the queue counts and the cycle looks for without parsing).
    waiting = models.PositiveIntegerField(default=0)
    #: Tasks cancelled before they became rows (they have no row to say so).
    cancelled_unmaterialized = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            models.Index(fields=["created_at"], condition=models.Q(waiting__gt=0), name="job_array_waiting"),
        ]

    def __str__(self) -> str:
        return f"array {self.array_id} ({self.count} tasks, {self.waiting} not yet rows)"


class JobLogChunk(models.Model):
    """A piece of one replica's output, as the node agent streamed it: ``offset`` is the byte position of
    ``text`` in that replica's log, so a reader resumes with ``?offset=`` and a resent chunk is a no-op."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="log_chunks")
    replica = models.PositiveSmallIntegerField(default=0)
    offset = models.PositiveBigIntegerField()
    text = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["job", "replica", "offset"]
        constraints = [
            models.UniqueConstraint(fields=["job", "replica", "offset"], name="job_log_chunk_unique_offset"),
        ]

    def __str__(self) -> str:
        return f"log of job {self.job_id} replica {self.replica} at {self.offset}"


class JobEvent(models.Model):
    """One state transition of a job (or a note on it, when ``from_state == to_state``)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    from_state = models.CharField(max_length=20, choices=JobState.choices, blank=True, default="")
    to_state = models.CharField(max_length=20, choices=JobState.choices)
    reason = models.CharField(max_length=40, blank=True, default="")
    message = models.CharField(max_length=500, blank=True, default="")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    details = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"job {self.job_id}: {self.from_state or '-'} → {self.to_state}"


class AllocationQuerySet(models.QuerySet):
    def active(self) -> AllocationQuerySet:
        return self.filter(ended_at__isnull=True)


class ReplicaPort(models.Model):
    """A TCP/UDP port of the node's job port range (``GPUPOOL_JOB_PORT_RANGE``) held by one replica of a job.

    Each replica holds one port on its node (its own: ``GPUPOOL_PORT``, its ``TF_CONFIG`` address) and replica 0
    one more, the job's rendezvous port (``MASTER_PORT``). The unique constraint makes it impossible for two rows
    to hold one port of one node; a row whose replica no longer holds an active allocation on the node is
    released (deleted) by the next reservation on that node (``scheduler.launch.ports_reserve``), so ports come
    back exactly when the replica's cards do — after its process has exited, a cancelled job's too.
    """

    class Purpose(models.TextChoices):
        REPLICA = "replica", _("replica")
        RENDEZVOUS = "rendezvous", _("rendezvous")
        NAMED = "named", _("named")  # one of the job's named ports (``name``): served through its endpoint

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="ports")
    port = models.PositiveIntegerField()
    job = models.ForeignKey("Job", on_delete=models.CASCADE, related_name="ports")
    replica = models.PositiveSmallIntegerField()
    purpose = models.CharField(max_length=16, choices=Purpose.choices, default=Purpose.REPLICA)
    #: The name of a named port (purpose ``named``: the job spec's ``ports``); blank otherwise.
    name = models.CharField(max_length=16, blank=True, default="")
    reserved_at = models.DateTimeField()

    class Meta:
        ordering = ["node_id", "port"]
        constraints = [models.UniqueConstraint(fields=["node", "port"], name="replicaport_one_holder_per_node_port")]
        indexes = [models.Index(fields=["job", "replica"], name="replicaport_job_replica")]

    def __str__(self) -> str:
        return f"{self.node_id}:{self.port} job {self.job_id}/{self.replica} ({self.purpose})"


class JobOutput(models.Model):
    """The packed output dir (``output_dir`` of the spec, a .tar.gz) one replica of a job left, collected by its
    node's agent when the replica ended and kept in the ``outputs`` storage (``STORAGES``)."""

    job = models.ForeignKey("Job", on_delete=models.CASCADE, related_name="outputs")
    replica = models.PositiveSmallIntegerField()
    node = models.ForeignKey(Node, null=True, on_delete=models.SET_NULL, related_name="+")
    file = models.FileField(storage=_outputs_storage, upload_to="outputs/", max_length=255)
    size_bytes = models.PositiveBigIntegerField()
    sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["job_id", "replica"]
        constraints = [models.UniqueConstraint(fields=["job", "replica"], name="joboutput_one_per_replica")]

    def __str__(self) -> str:
        return f"output of job {self.job_id} replica {self.replica}"


class Allocation(models.Model):
    """A share of one device held by one replica of a job. Active while ``ended_at`` is null.

    Double booking is refused three times over: the cycle re-checks capacity under row locks on the devices
    (``scheduler.persist``), a partial unique constraint keeps one active row per (job, replica, device), and
    on PostgreSQL a trigger (migration 0003) refuses any insert that takes a device past 1000 millis or its
    memory, whoever writes it.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="allocations")
    replica = models.PositiveSmallIntegerField()
    # Denormalised from the job: quota usage sums by tenant without a join.
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="allocations")
    flavor = models.ForeignKey(ResourceFlavor, on_delete=models.PROTECT, related_name="allocations")
    device = models.ForeignKey(Device, on_delete=models.PROTECT, related_name="allocations")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="allocations")
    millis = models.PositiveIntegerField()
    memory_mib = models.PositiveIntegerField(default=0)
    # Part of ``millis`` above the tenant's guarantee: reclaimable by the lender.
    borrowed_millis = models.PositiveIntegerField(default=0)
    # Runs on this inference service's idle reservation (on loan: reclaimed when the service scales up). Its
    # capacity is inside the reservation's, so it is not counted again on the device.
    reservation_of = models.ForeignKey(
        "Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="borrowed_allocations"
    )
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True, db_index=True)

    objects = AllocationQuerySet.as_manager()

    class Meta:
        ordering = ["job_id", "replica", "device_id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(millis__gte=MIN_FRACTION_MILLIS, millis__lte=MILLIS_PER_DEVICE),
                name="allocation_millis_in_range",
            ),
            models.CheckConstraint(
                condition=models.Q(borrowed_millis__lte=models.F("millis")), name="allocation_borrowed_le_millis"
            ),
            models.UniqueConstraint(
                fields=["job", "replica", "device"],
                condition=models.Q(ended_at__isnull=True),
                name="allocation_one_active_per_replica_device",
            ),
            # At most one active whole-card allocation per device (the trigger covers mixed cases).
            models.UniqueConstraint(
                fields=["device"],
                condition=models.Q(ended_at__isnull=True, millis=MILLIS_PER_DEVICE),
                name="allocation_one_active_exclusive_per_device",
            ),
        ]
        indexes = [models.Index(fields=["device", "ended_at"], name="allocation_device_active")]

    def __str__(self) -> str:
        return f"job {self.job_id}/{self.replica} on {self.device_id}: {self.millis} millis"

    @property
    def active(self) -> bool:
        return self.ended_at is None


class InferenceReservation(models.Model):
    """Capacity an inference service keeps on one device for a replica it may scale up to (``max_replicas``)
    but does not run now (``scheduler.core.types.Reservation``).

    Made by a cycle when it places the service (``Place.reserved``) and when a replica stops on scale-down;
    consumed when the service scales up onto it; deleted when the service leaves the active states or its
    ``max_replicas`` no longer covers it. Ordinary jobs cannot use it; preemptible training and batch may
    run on it (``Allocation.reservation_of``) until the service takes it back.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="reservations")
    replica = models.PositiveSmallIntegerField()
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="reservations")
    flavor = models.ForeignKey(ResourceFlavor, on_delete=models.PROTECT, related_name="reservations")
    device = models.ForeignKey(Device, on_delete=models.PROTECT, related_name="reservations")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="reservations")
    millis = models.PositiveIntegerField()
    memory_mib = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["job_id", "replica", "device_id"]
        constraints = [
            models.UniqueConstraint(fields=["job", "replica", "device"], name="reservation_one_per_replica_device"),
            models.CheckConstraint(
                condition=models.Q(millis__gte=MIN_FRACTION_MILLIS, millis__lte=MILLIS_PER_DEVICE),
                name="reservation_millis_in_range",
            ),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id}/{self.replica} reserves {self.millis} millis on {self.device_id}"


class CapacityHold(models.Model):
    """A device kept for a preemptor while its victims stop, until it starts (``scheduler.core.types.Hold``).

    Each cycle replaces the whole set with its plan's ``holds`` and reads it back into the next snapshot, so
    the capacity a preemption frees goes to the preemptor and to no job ahead of it.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="capacity_holds")
    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="capacity_holds")
    victim_ids = models.JSONField(default=list, blank=True)  # job ids still stopping for it
    since = models.DateTimeField()

    class Meta:
        ordering = ["job_id", "device_id"]
        constraints = [models.UniqueConstraint(fields=["device"], name="capacity_hold_one_per_device")]

    def __str__(self) -> str:
        return f"device {self.device_id} held for job {self.job_id}"


class SnapshotChange(models.Model):
    """A row the scheduling snapshot reads that changed: written by PostgreSQL triggers on the tables it reads
    (migration 0014), one row per changed row and statement, stamped with the writing transaction's id
    (``pg_current_xact_id()``). The incremental snapshot (``scheduler.live_snapshot``) reads those at or after
    the oldest transaction that was still running when it last read, so a transaction that commits late is
    never missed, and prunes what every reader has seen."""

    xid = models.BigIntegerField(db_index=True)
    source = models.CharField(max_length=16)
    row_id = models.BigIntegerField()

    def __str__(self) -> str:
        return f"{self.source} {self.row_id} (xid {self.xid})"


class SnapshotChangeHorizon(models.Model):
    """One row: changes of transactions below ``pruned_below`` were deleted; a reader whose last read is older
    rebuilds its state in full."""

    pruned_below = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"snapshot changes pruned below xid {self.pruned_below}"
