"""The scheduler's sentences: why a job waits, what happened to it, what it asks that can never fit.

Each is a template (``%(name)s`` placeholders) stated once here, in the pure engine, and written with
``say(TEMPLATE, name=value)``; the database keeps the English sentence so the API, exports and the audit trail
read the same words. ``scheduler.message_text`` reads a stored sentence back through the pattern it derives from
the same template, and shows it in the reader's language (the template is the gettext msgid). No Django here.
"""

from __future__ import annotations


def say(template: str, **params: object) -> str:
    """The sentence ``template`` writes with ``params`` (each shown as ``str`` shows it)."""
    return template % {name: str(value) for name, value in params.items()}


def clauses(*sentences: str) -> str:
    """Sentences said one after the other, as one ("…; …"); an empty one is left out."""
    return "; ".join(sentence for sentence in sentences if sentence)


TENANT_NO_QUOTA = "tenant %(tenant)s has no quota for %(flavor)s"
ASK_SYSTEM_ADMIN_ONE = "ask a system admin for one"
TENANT_QUOTA_LIMIT_REACHED = (
    "tenant quota limit for %(flavor)s reached: %(used)s/%(limit)s cards in use, this job needs %(need)s"
)
PARENT_TENANT_QUOTA_LIMIT = (
    "parent tenant %(tenant)s of quota limit for %(flavor)s reached: %(used)s/%(limit)s cards in use, this job "
    "needs %(need)s"
)
JOB_BORROWING_UNDER_LIMIT = (
    "%(jobs)s job(s) borrowing %(flavor)s under that limit are reclaimed for it once they have run the minimum "
    "runtime, in about %(minutes)s min"
)
CARDS_LEFT_UNDER_QUOTA = (
    "the %(left)s cards left under the quota limit of %(tenant)s for %(flavor)s are owed to queued jobs within "
    "their guarantee"
)
TENANT_ALREADY_RUNS_JOBS = "tenant %(tenant)s already runs %(jobs)s/%(max)s jobs on %(flavor)s"
TENANT_QUOTA_EXHAUSTED_CARDS = "tenant quota for %(flavor)s exhausted: %(used)s/%(g)s cards in use (borrowing is off)"
TENANT_QUOTA_EXHAUSTED_NONE_TO_LEND = (
    "tenant quota for %(flavor)s exhausted: %(used)s/%(g)s cards in use and other tenants have no idle %(flavor)s "
    "capacity to lend (this job would borrow %(borrow)s)"
)
TENANT_QUOTA_EXHAUSTED_BECAUSE = "tenant quota for %(flavor)s exhausted: %(used)s/%(g)s cards in use (%(why)s)"
TENANT_QUOTA_EXHAUSTED = "tenant quota for %(flavor)s exhausted: %(used)s/%(g)s cards in use"
PREEMPTED_NO_LONGER_BORROWS = (
    "preempted %(count)s time(s), it no longer borrows idle capacity: it starts as soon as its tenant's guarantee "
    "has room"
)
PREEMPTED_MAY_BORROW_AGAIN = (
    "preempted %(count)s time(s), it may borrow idle capacity again in %(minutes)s min, or start as soon as its "
    "tenant's guarantee has room"
)
BORROWING_OFF = "borrowing is off"
ONLY_PREEMPTIBLE_JOBS_MAY = "only preemptible jobs may borrow idle capacity of other tenants"
NO_HEALTHY_SCHEDULABLE_DEVICE = "no healthy, schedulable %(flavor)s device in the pool"
NO_SCHEDULABLE_NODE_MATCHES = "no schedulable node with %(flavor)s matches %(wanted)s"
ONLY_REPLICAS_FIT_ONCE = "only %(placed)s of %(count)s replicas fit at once"
JOB_STARTS_WHEN_ALL = "the job starts when all %(count)s fit"
NO_NODE_ROOM_X = "no node has room for %(count)s x %(size)s %(flavor)s (%(mem)s MiB each) on one node"
NO_CARD_CARD_MIB = "no %(flavor)s card has %(size)s card and %(mem)s MiB memory free together"
NO_CARD_CARD_MILLIS = "no %(flavor)s card has %(size)s card (%(millis)s millis) free"
NO_NODE_CARDS_LARGEST = "no node has %(n)s %(flavor)s cards (the largest has %(largest)s)"
ASK_FEWER_CARDS_PER = "ask for fewer cards per replica"
NO_NODE_FREE_CARDS = (
    "no node has %(n)s free %(flavor)s cards on one node for all replicas right now (most free on one node: %(most)s)"
)
NO_NODE_FREE_CARDS_ONE = (
    "no node has %(n)s free %(flavor)s cards on one node right now (most free on one node: %(most)s)"
)
NO_CARD_MIB_MEMORY = "no %(flavor)s card has %(mem)s MiB memory"
NO_NODE_FREE_CARDS_ONE_NVLINK = "no node has %(n)s free %(flavor)s cards on one NVLink domain"
NO_NODE_FREE_CARDS_ONE_NUMA = "no node has %(n)s free %(flavor)s cards on one NUMA node"
NO_NODE_FREE_CARDS_MATCH = "no node has %(n)s free %(flavor)s cards that match the job's constraints right now"
NO_NODE_BESIDE_FREE = "no node has %(host)s beside %(size)s free %(flavor)s card"
NO_NODE_BESIDE_FREE_CARDS = "no node has %(host)s beside %(size)s free %(flavor)s cards"
WAITING_FOR_APPROVAL = "waiting for approval by an administrator"
NOT_LOOKED_CYCLE_MOST = "not looked at this cycle (at most %(cap)s jobs a cycle)"
REQUEST_CANNOT_SCHEDULED = "the request cannot be scheduled: %(problem)s"
WAITING_BEHIND_JOB_WHICH = "waiting behind job %(head)s, which is first in the %(flavor)s queue (backfill is off)"
DEVICE_HELD_HEAD_QUEUE = "%(count)s %(flavor)s device(s) are held for it as the head of the queue"
WAITING_PREEMPTED_JOB_STOP = "waiting for %(count)s preempted job(s) to stop"
DEVICE_HELD_MEANWHILE = "%(count)s %(flavor)s device(s) are held for it meanwhile"
WAITING_JOB_STOP_FREE = "waiting for %(count)s job(s) to stop and free %(size)s %(flavor)s card(s) for it"
STARTS_FOLLOWING_CYCLE = "it starts in a following cycle"
SCALING_UP_INTO_RESERVATION = "scaling up into its reservation"
WAITING_JOB_RUNNING_STOP = "waiting for %(count)s job(s) running on it to stop"
TENANT_BORROWED_CAPACITY_NEEDS = "its tenant %(tenant)s borrowed capacity that %(other)s needs back"
HIGHER_PRIORITY_JOB_PRIORITY = "higher-priority job %(job)s (priority %(priority)s) needs the capacity"
JOB_NAMES_NO_DEVICE = "the job names no device flavor"
JOB_ASKS_NO_REPLICAS = "the job asks for no replicas"
REPLICA_MUST_ASK_LEAST = "a replica must ask for at least %(min)s millis (1/10 of a card)"
FRACTION_CARD_MUST_MULTIPLE = "a fraction of a card must be a multiple of %(step)s millis"
FRACTIONAL_REQUEST_MUST_STATE = "a fractional request must state memory_mib"
MORE_ONE_CARD_MUST = "more than one card must be a whole number of cards (a multiple of 1000 millis)"
MEMORY_MIB_CANNOT_NEGATIVE = "memory_mib cannot be negative"
HOST_CPU_HOST_MEMORY = "host CPU and host memory cannot be negative"
PLACED = "Placed on %(nodes)s."
REPLICAS_PLACED = "Replicas %(replicas)s placed on %(nodes)s."
PREEMPTED_JOB = "Preempted for job %(job)s."
QUEUED_SCHEDULER_LOOKS_WITHIN = "Queued; the scheduler looks at it within a few seconds."
JOB_WAITS_FOR_APPROVAL = "Waiting for approval by an administrator."
DEVICES_CHOSEN_JOB_TAKEN = "The devices chosen for this job were taken a moment ago; it is tried again next cycle."
NODE_NO_FREE_PORT = (
    "Node %(node)s has no free port in its job port range (%(range)s: %(held)s held by running jobs); the job "
    "starts when a job there ends, or an administrator widens the range (gpupool-agent --job-ports, "
    "GPUPOOL_JOB_PORT_RANGE)."
)
PER_REPLICA_CARDS_ASKED = "per-replica cards: %(n)s asked, the largest %(flavor)s node has %(m)s"
MEMORY_MIB_ASKED_LARGEST = "memory_mib: %(n)s asked, the largest %(flavor)s card has %(m)s"
CPU_CORES_PER_REPLICA = "CPU cores per replica: %(n)s asked, the largest %(flavor)s node has %(m)s"
HOST_MEMORY_PER_REPLICA = "host memory per replica: %(n)s MiB asked, the largest %(flavor)s node has %(m)s MiB"
CARDS_ONCE_ASKED_X = "cards at once: %(n)s asked (%(r)s x %(c)s), the pool has %(m)s %(flavor)s cards in all"
DEVICE_MEMORY_ONCE_MIB = (
    "device memory at once: %(n)s MiB asked (%(r)s x %(c)s), the %(flavor)s cards have %(m)s MiB in all"
)
CARDS_ONE_NODE_SAME = "cards on one node (same_node): %(n)s asked, the largest %(flavor)s node has %(m)s"
TENANTS_QUOTA_TREE_ALLOWS = (
    "the tenant's quota tree allows at most %(m)s %(flavor)s cards (limit of %(tenant)s), this job asks %(n)s"
)
JOB_NOT_PREEMPTIBLE_GETS = (
    "a job that is not preemptible gets only its tenant's guarantee: at most %(m)s %(flavor)s cards (guarantee of "
    "%(tenant)s), this job asks %(n)s"
)
CANNOT_START_UNTIL_NODES = "it cannot start until nodes or quotas change"
REPLICAS_CARDS_ONE_NODE = "a replica's cards are on one node: ask for at most %(m)s per replica and more replicas"
ASK_MOST_MIB_DEVICE = "ask for at most %(m)s MiB of device memory per card"
ASK_MOST_CORES_PER = "ask for at most %(m)s cores per replica"
ASK_MOST_MIB_HOST = "ask for at most %(m)s MiB of host memory per replica"
ALL_REPLICAS_START_TOGETHER = "all replicas start together: ask for at most %(m)s cards in all"
ALL_REPLICAS_START_TOGETHER_ASK = "all replicas start together: ask for fewer replicas or less memory each"
ASK_MOST_CARDS_ALL = 'ask for at most %(m)s cards in all, or a topology other than "same_node"'
ASK_MOST_CARDS_ALL_ASK = "ask for at most %(m)s cards in all, or ask an admin of %(tenant)s to raise its limit"
SET_PREEMPTIBLE_TRUE_BORROW = 'set "preemptible": true to borrow idle cards, or ask for at most %(m)s'
CANCELLED = "Cancelled."
APPROVED = "Approved."
REJECTED = "Rejected: %(comment)s"

#: Every sentence, in the order ``scheduler.message_text`` tries them (the more specific first).
ALL: tuple[str, ...] = (
    TENANT_NO_QUOTA,
    ASK_SYSTEM_ADMIN_ONE,
    TENANT_QUOTA_LIMIT_REACHED,
    PARENT_TENANT_QUOTA_LIMIT,
    JOB_BORROWING_UNDER_LIMIT,
    CARDS_LEFT_UNDER_QUOTA,
    TENANT_ALREADY_RUNS_JOBS,
    TENANT_QUOTA_EXHAUSTED_CARDS,
    TENANT_QUOTA_EXHAUSTED_NONE_TO_LEND,
    TENANT_QUOTA_EXHAUSTED_BECAUSE,
    TENANT_QUOTA_EXHAUSTED,
    PREEMPTED_NO_LONGER_BORROWS,
    PREEMPTED_MAY_BORROW_AGAIN,
    BORROWING_OFF,
    ONLY_PREEMPTIBLE_JOBS_MAY,
    NO_HEALTHY_SCHEDULABLE_DEVICE,
    NO_SCHEDULABLE_NODE_MATCHES,
    ONLY_REPLICAS_FIT_ONCE,
    JOB_STARTS_WHEN_ALL,
    NO_NODE_ROOM_X,
    NO_CARD_CARD_MIB,
    NO_CARD_CARD_MILLIS,
    NO_NODE_CARDS_LARGEST,
    ASK_FEWER_CARDS_PER,
    NO_NODE_FREE_CARDS,
    NO_NODE_FREE_CARDS_ONE,
    NO_CARD_MIB_MEMORY,
    NO_NODE_FREE_CARDS_ONE_NVLINK,
    NO_NODE_FREE_CARDS_ONE_NUMA,
    NO_NODE_FREE_CARDS_MATCH,
    NO_NODE_BESIDE_FREE,
    NO_NODE_BESIDE_FREE_CARDS,
    WAITING_FOR_APPROVAL,
    NOT_LOOKED_CYCLE_MOST,
    REQUEST_CANNOT_SCHEDULED,
    WAITING_BEHIND_JOB_WHICH,
    DEVICE_HELD_HEAD_QUEUE,
    WAITING_PREEMPTED_JOB_STOP,
    DEVICE_HELD_MEANWHILE,
    WAITING_JOB_STOP_FREE,
    STARTS_FOLLOWING_CYCLE,
    SCALING_UP_INTO_RESERVATION,
    WAITING_JOB_RUNNING_STOP,
    TENANT_BORROWED_CAPACITY_NEEDS,
    HIGHER_PRIORITY_JOB_PRIORITY,
    JOB_NAMES_NO_DEVICE,
    JOB_ASKS_NO_REPLICAS,
    REPLICA_MUST_ASK_LEAST,
    FRACTION_CARD_MUST_MULTIPLE,
    FRACTIONAL_REQUEST_MUST_STATE,
    MORE_ONE_CARD_MUST,
    MEMORY_MIB_CANNOT_NEGATIVE,
    HOST_CPU_HOST_MEMORY,
    PLACED,
    REPLICAS_PLACED,
    PREEMPTED_JOB,
    QUEUED_SCHEDULER_LOOKS_WITHIN,
    JOB_WAITS_FOR_APPROVAL,
    DEVICES_CHOSEN_JOB_TAKEN,
    NODE_NO_FREE_PORT,
    PER_REPLICA_CARDS_ASKED,
    MEMORY_MIB_ASKED_LARGEST,
    CPU_CORES_PER_REPLICA,
    HOST_MEMORY_PER_REPLICA,
    CARDS_ONCE_ASKED_X,
    DEVICE_MEMORY_ONCE_MIB,
    CARDS_ONE_NODE_SAME,
    TENANTS_QUOTA_TREE_ALLOWS,
    JOB_NOT_PREEMPTIBLE_GETS,
    CANNOT_START_UNTIL_NODES,
    REPLICAS_CARDS_ONE_NODE,
    ASK_MOST_MIB_DEVICE,
    ASK_MOST_CORES_PER,
    ASK_MOST_MIB_HOST,
    ALL_REPLICAS_START_TOGETHER,
    ALL_REPLICAS_START_TOGETHER_ASK,
    ASK_MOST_CARDS_ALL,
    ASK_MOST_CARDS_ALL_ASK,
    SET_PREEMPTIBLE_TRUE_BORROW,
    CANCELLED,
    APPROVED,
    REJECTED,
)
