"""The scheduler's sentences in the reader's language.

The engine (``scheduler.core``, no Django) and the persistence layer write why a job waits or what happened to
it as English sentences with the data in them ("no node has 4 free nvidia-h100-80g cards on one node right now
(most free on one node: 2)"); the database keeps them so the API, exports and the audit trail read the same
words. ``localize`` turns such a sentence into the active language when it is shown: it splits it into
clauses, recognises each by its pattern, and formats the translated template with the clause's own data. A
clause no pattern knows stays as it was (a test renders every pattern in Chinese, so a new engine sentence
without a pattern here shows up there).
"""

from __future__ import annotations

import re

from django.utils.translation import gettext, gettext_noop

_FLAVOR = r"(?P<flavor>[\w.-]+)"
_N = r"(?P<n>\d+)"

# (pattern of one clause, its English template with the same named groups). The template is the msgid.
PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (
        rf"tenant (?P<tenant>[\w.-]+) has no quota for {_FLAVOR}",
        gettext_noop("tenant %(tenant)s has no quota for %(flavor)s"),
    ),
    (r"ask a system admin for one", gettext_noop("ask a system admin for one")),
    (
        rf"tenant quota limit for {_FLAVOR} reached: (?P<used>[\d.]+)/(?P<limit>[\d.]+) cards in use, "
        r"this job needs (?P<need>[\d.]+)",
        gettext_noop(
            "tenant quota limit for %(flavor)s reached: %(used)s/%(limit)s cards in use, this job needs %(need)s"
        ),
    ),
    (
        rf"parent tenant (?P<tenant>[\w.-]+) of quota limit for {_FLAVOR} reached: (?P<used>[\d.]+)/"
        r"(?P<limit>[\d.]+) cards in use, this job needs (?P<need>[\d.]+)",
        gettext_noop(
            "quota limit of parent tenant %(tenant)s for %(flavor)s reached: %(used)s/%(limit)s cards in use, "
            "this job needs %(need)s"
        ),
    ),
    (
        rf"(?P<jobs>\d+) job\(s\) borrowing {_FLAVOR} under that limit are reclaimed for it once they have run "
        r"the minimum runtime, in about (?P<minutes>\d+) min",
        gettext_noop(
            "%(jobs)s job(s) borrowing %(flavor)s under that limit are reclaimed for it once they have run the "
            "minimum runtime, in about %(minutes)s min"
        ),
    ),
    (
        rf"the (?P<left>[\d.]+) cards left under the quota limit of (?P<tenant>[\w.-]+) for {_FLAVOR} are owed "
        r"to queued jobs within their guarantee",
        gettext_noop(
            "the %(left)s cards left under the quota limit of %(tenant)s for %(flavor)s are owed to queued jobs "
            "within their guarantee"
        ),
    ),
    (
        rf"tenant (?P<tenant>[\w.-]+) already runs (?P<jobs>\d+)/(?P<max>\d+) jobs on {_FLAVOR}",
        gettext_noop("tenant %(tenant)s already runs %(jobs)s/%(max)s jobs on %(flavor)s"),
    ),
    (
        rf"tenant quota for {_FLAVOR} exhausted: (?P<used>[\d.]+)/(?P<g>[\d.]+) cards in use \(borrowing is off\)",
        gettext_noop("tenant quota for %(flavor)s exhausted: %(used)s/%(g)s cards in use (borrowing is off)"),
    ),
    (
        rf"tenant quota for {_FLAVOR} exhausted: (?P<used>[\d.]+)/(?P<g>[\d.]+) cards in use and other tenants "
        rf"have no idle [\w.-]+ capacity to lend \(this job would borrow (?P<borrow>[\d.]+)\)",
        gettext_noop(
            "tenant quota for %(flavor)s exhausted: %(used)s/%(g)s cards in use and other tenants have no idle "
            "capacity to lend (this job would borrow %(borrow)s)"
        ),
    ),
    (
        rf"tenant quota for {_FLAVOR} exhausted: (?P<used>[\d.]+)/(?P<g>[\d.]+) cards in use",
        gettext_noop("tenant quota for %(flavor)s exhausted: %(used)s/%(g)s cards in use"),
    ),
    (
        r"only preemptible jobs may borrow idle capacity of other tenants",
        gettext_noop("only preemptible jobs may borrow idle capacity of other tenants"),
    ),
    (
        rf"no healthy, schedulable {_FLAVOR} device in the pool",
        gettext_noop("no healthy, schedulable %(flavor)s device in the pool"),
    ),
    (
        rf"no schedulable node with {_FLAVOR} matches (?P<wanted>.+)",
        gettext_noop("no schedulable node with %(flavor)s matches %(wanted)s"),
    ),
    (
        r"only (?P<placed>\d+) of (?P<count>\d+) replicas fit at once",
        gettext_noop("only %(placed)s of %(count)s replicas fit at once"),
    ),
    (r"the job starts when all (?P<count>\d+) fit", gettext_noop("the job starts when all %(count)s fit")),
    (
        rf"no node has room for (?P<count>\d+) x (?P<size>[\d.]+) {_FLAVOR} \((?P<mem>\d+) MiB each\) on one node",
        gettext_noop("no node has room for %(count)s x %(size)s %(flavor)s (%(mem)s MiB each) on one node"),
    ),
    (
        rf"no {_FLAVOR} card has (?P<size>[\d.]+) card and (?P<mem>\d+) MiB memory free together",
        gettext_noop("no %(flavor)s card has %(size)s card and %(mem)s MiB memory free together"),
    ),
    (
        rf"no {_FLAVOR} card has (?P<size>[\d.]+) card \((?P<millis>\d+) millis\) free",
        gettext_noop("no %(flavor)s card has %(size)s card (%(millis)s millis) free"),
    ),
    (
        rf"no node has {_N} {_FLAVOR} cards \(the largest has (?P<largest>\d+)\)",
        gettext_noop("no node has %(n)s %(flavor)s cards (the largest has %(largest)s)"),
    ),
    (r"ask for fewer cards per replica", gettext_noop("ask for fewer cards per replica")),
    (
        rf"no node has {_N} free {_FLAVOR} cards on one node for all replicas right now "
        r"\(most free on one node: (?P<most>\d+)\)",
        gettext_noop(
            "no node has %(n)s free %(flavor)s cards on one node for all replicas right now "
            "(most free on one node: %(most)s)"
        ),
    ),
    (
        rf"no node has {_N} free {_FLAVOR} cards on one node right now \(most free on one node: (?P<most>\d+)\)",
        gettext_noop("no node has %(n)s free %(flavor)s cards on one node right now (most free on one node: %(most)s)"),
    ),
    (rf"no {_FLAVOR} card has (?P<mem>\d+) MiB memory", gettext_noop("no %(flavor)s card has %(mem)s MiB memory")),
    (
        rf"no node has {_N} free {_FLAVOR} cards on one NVLink domain",
        gettext_noop("no node has %(n)s free %(flavor)s cards on one NVLink domain"),
    ),
    (
        rf"no node has {_N} free {_FLAVOR} cards on one NUMA node",
        gettext_noop("no node has %(n)s free %(flavor)s cards on one NUMA node"),
    ),
    (
        rf"no node has {_N} free {_FLAVOR} cards that match the job's constraints right now",
        gettext_noop("no node has %(n)s free %(flavor)s cards that match the job's constraints right now"),
    ),
    (
        rf"no node has (?P<host>.+) beside (?P<size>[\d.]+) free {_FLAVOR} card",
        gettext_noop("no node has %(host)s beside %(size)s free %(flavor)s card"),
    ),
    (
        rf"no node has (?P<host>.+) beside (?P<size>[\d.]+) free {_FLAVOR} cards",
        gettext_noop("no node has %(host)s beside %(size)s free %(flavor)s cards"),
    ),
    (
        r"waiting for approval by an administrator\.?",
        gettext_noop("waiting for approval by an administrator"),
    ),
    (
        r"not looked at this cycle \(at most (?P<cap>\d+) jobs a cycle\)",
        gettext_noop("not looked at this cycle (at most %(cap)s jobs a cycle)"),
    ),
    (
        r"the request cannot be scheduled: (?P<problem>.+)",
        gettext_noop("the request cannot be scheduled: %(problem)s"),
    ),
    (
        rf"waiting behind job (?P<head>\d+), which is first in the {_FLAVOR} queue \(backfill is off\)",
        gettext_noop("waiting behind job %(head)s, which is first in the %(flavor)s queue (backfill is off)"),
    ),
    (
        rf"(?P<count>\d+) {_FLAVOR} device\(s\) are held for it as the head of the queue",
        gettext_noop("%(count)s %(flavor)s device(s) are held for it as the head of the queue"),
    ),
    (
        r"waiting for (?P<count>\d+) preempted job\(s\) to stop",
        gettext_noop("waiting for %(count)s preempted job(s) to stop"),
    ),
    (
        rf"(?P<count>\d+) {_FLAVOR} device\(s\) are held for it meanwhile",
        gettext_noop("%(count)s %(flavor)s device(s) are held for it meanwhile"),
    ),
    (
        rf"waiting for (?P<count>\d+) job\(s\) to stop and free (?P<size>[\d.]+) {_FLAVOR} card\(s\) for it",
        gettext_noop("waiting for %(count)s job(s) to stop and free %(size)s %(flavor)s card(s) for it"),
    ),
    (r"it starts in a following cycle", gettext_noop("it starts in a following cycle")),
    (
        r"scaling up into its reservation",
        gettext_noop("scaling up into its reservation"),
    ),
    (
        r"waiting for (?P<count>\d+) job\(s\) running on it to stop",
        gettext_noop("waiting for %(count)s job(s) running on it to stop"),
    ),
    (
        r"its tenant (?P<tenant>[\w.-]+) borrowed capacity that (?P<other>[\w.-]+) needs back",
        gettext_noop("its tenant %(tenant)s borrowed capacity that %(other)s needs back"),
    ),
    (
        r"higher-priority job (?P<job>\d+) \(priority (?P<priority>\d+)\) needs the capacity",
        gettext_noop("higher-priority job %(job)s (priority %(priority)s) needs the capacity"),
    ),
    # The problems of a request no waiting fixes (scheduler.core.engine.validate), inside the sentence above.
    (r"the job names no device flavor", gettext_noop("the job names no device flavor")),
    (r"the job asks for no replicas", gettext_noop("the job asks for no replicas")),
    (
        r"a replica must ask for at least (?P<min>\d+) millis \(1/10 of a card\)",
        gettext_noop("a replica must ask for at least %(min)s millis (1/10 of a card)"),
    ),
    (
        r"a fraction of a card must be a multiple of (?P<step>\d+) millis",
        gettext_noop("a fraction of a card must be a multiple of %(step)s millis"),
    ),
    (r"a fractional request must state memory_mib", gettext_noop("a fractional request must state memory_mib")),
    (
        r"more than one card must be a whole number of cards \(a multiple of 1000 millis\)",
        gettext_noop("more than one card must be a whole number of cards (a multiple of 1000 millis)"),
    ),
    (r"memory_mib cannot be negative", gettext_noop("memory_mib cannot be negative")),
    (r"host CPU and host memory cannot be negative", gettext_noop("host CPU and host memory cannot be negative")),
    # Written by the portal (scheduler.persist, scheduler.services).
    (r"Placed on (?P<nodes>[\w., -]+)\.", gettext_noop("Placed on %(nodes)s.")),
    (
        r"Replicas (?P<replicas>[\d, ]+) placed on (?P<nodes>[\w., -]+)\.",
        gettext_noop("Replicas %(replicas)s placed on %(nodes)s."),
    ),
    (r"Preempted for job (?P<job>\d+)\.", gettext_noop("Preempted for job %(job)s.")),
    (
        r"Queued; the scheduler looks at it within a few seconds\.",
        gettext_noop("Queued; the scheduler looks at it within a few seconds."),
    ),
    (r"Waiting for approval by an administrator\.", gettext_noop("Waiting for approval by an administrator.")),
    (
        r"The devices chosen for this job were taken a moment ago; it is tried again next cycle\.",
        gettext_noop("The devices chosen for this job were taken a moment ago; it is tried again next cycle."),
    ),
    (
        r"Node (?P<node>[\w.-]+) has no free port in its job port range \((?P<range>\d+-\d+): (?P<held>\d+) held by "
        r"running jobs\); the job starts when a job there ends, or an administrator widens the range "
        r"\(gpupool-agent --job-ports, GPUPOOL_JOB_PORT_RANGE\)\.",
        gettext_noop(
            "Node %(node)s has no free port in its job port range (%(range)s: %(held)s held by running jobs); the "
            "job starts when a job there ends, or an administrator widens the range (gpupool-agent --job-ports, "
            "GPUPOOL_JOB_PORT_RANGE)."
        ),
    ),
    # never_fits (scheduler.core.feasibility): the most the registered pool or the quota tree can ever give.
    (
        rf"per-replica cards: (?P<n>\d+) asked, the largest {_FLAVOR} node has (?P<m>\d+)",
        gettext_noop("per-replica cards: %(n)s asked, the largest %(flavor)s node has %(m)s"),
    ),
    (
        rf"memory_mib: (?P<n>\d+) asked, the largest {_FLAVOR} card has (?P<m>\d+)",
        gettext_noop("memory_mib: %(n)s asked, the largest %(flavor)s card has %(m)s"),
    ),
    (
        rf"CPU cores per replica: (?P<n>[\d.]+) asked, the largest {_FLAVOR} node has (?P<m>[\d.]+)",
        gettext_noop("CPU cores per replica: %(n)s asked, the largest %(flavor)s node has %(m)s"),
    ),
    (
        rf"host memory per replica: (?P<n>\d+) MiB asked, the largest {_FLAVOR} node has (?P<m>\d+) MiB",
        gettext_noop("host memory per replica: %(n)s MiB asked, the largest %(flavor)s node has %(m)s MiB"),
    ),
    (
        rf"cards at once: (?P<n>[\d.]+) asked \((?P<r>\d+) x (?P<c>[\d.]+)\), the pool has (?P<m>\d+) {_FLAVOR} "
        r"cards in all",
        gettext_noop("cards at once: %(n)s asked (%(r)s x %(c)s), the pool has %(m)s %(flavor)s cards in all"),
    ),
    (
        rf"device memory at once: (?P<n>\d+) MiB asked \((?P<r>\d+) x (?P<c>\d+)\), the {_FLAVOR} cards have "
        r"(?P<m>\d+) MiB in all",
        gettext_noop(
            "device memory at once: %(n)s MiB asked (%(r)s x %(c)s), the %(flavor)s cards have %(m)s MiB in all"
        ),
    ),
    (
        rf"cards on one node \(same_node\): (?P<n>[\d.]+) asked, the largest {_FLAVOR} node has (?P<m>\d+)",
        gettext_noop("cards on one node (same_node): %(n)s asked, the largest %(flavor)s node has %(m)s"),
    ),
    (
        rf"the tenant's quota tree allows at most (?P<m>[\d.]+) {_FLAVOR} cards \(limit of (?P<tenant>[\w.-]+)\), "
        r"this job asks (?P<n>[\d.]+)",
        gettext_noop(
            "the tenant's quota tree allows at most %(m)s %(flavor)s cards (limit of %(tenant)s), this job asks %(n)s"
        ),
    ),
    (
        rf"a job that is not preemptible gets only its tenant's guarantee: at most (?P<m>[\d.]+) {_FLAVOR} cards "
        r"\(guarantee of (?P<tenant>[\w.-]+)\), this job asks (?P<n>[\d.]+)",
        gettext_noop(
            "a job that is not preemptible gets only its tenant's guarantee: at most %(m)s %(flavor)s cards "
            "(guarantee of %(tenant)s), this job asks %(n)s"
        ),
    ),
    (r"it cannot start until nodes or quotas change", gettext_noop("it cannot start until nodes or quotas change")),
    # ... and how to change such a job so that it fits (the refusal at submit).
    (
        r"a replica's cards are on one node: ask for at most (?P<m>\d+) per replica and more replicas",
        gettext_noop("a replica's cards are on one node: ask for at most %(m)s per replica and more replicas"),
    ),
    (
        r"ask for at most (?P<m>\d+) MiB of device memory per card",
        gettext_noop("ask for at most %(m)s MiB of device memory per card"),
    ),
    (r"ask for at most (?P<m>[\d.]+) cores per replica", gettext_noop("ask for at most %(m)s cores per replica")),
    (
        r"ask for at most (?P<m>\d+) MiB of host memory per replica",
        gettext_noop("ask for at most %(m)s MiB of host memory per replica"),
    ),
    (
        r"all replicas start together: ask for at most (?P<m>\d+) cards in all",
        gettext_noop("all replicas start together: ask for at most %(m)s cards in all"),
    ),
    (
        r"all replicas start together: ask for fewer replicas or less memory each",
        gettext_noop("all replicas start together: ask for fewer replicas or less memory each"),
    ),
    (
        r'ask for at most (?P<m>\d+) cards in all, or a topology other than "same_node"',
        gettext_noop('ask for at most %(m)s cards in all, or a topology other than "same_node"'),
    ),
    (
        r"ask for at most (?P<m>[\d.]+) cards in all, or ask an admin of (?P<tenant>[\w.-]+) to raise its limit",
        gettext_noop("ask for at most %(m)s cards in all, or ask an admin of %(tenant)s to raise its limit"),
    ),
    (
        r'set "preemptible": true to borrow idle cards, or ask for at most (?P<m>[\d.]+)',
        gettext_noop('set "preemptible": true to borrow idle cards, or ask for at most %(m)s'),
    ),
    (r"Cancelled\.", gettext_noop("Cancelled.")),
    (r"Approved\.", gettext_noop("Approved.")),
    (r"Rejected: (?P<comment>.*)", gettext_noop("Rejected: %(comment)s")),
]
_COMPILED = [(re.compile(f"^{pattern}$", re.DOTALL), template) for pattern, template in PATTERNS]
_POSITION = re.compile(
    r"^(?P<body>.*) \(position (?P<overall>\d+) in the queue, (?P<mine>\d+) among (?P<tenant>.+)'s jobs\)$", re.DOTALL
)


_CPU = re.compile(r"^(?P<cores>[\d.]+) free CPU cores$")
_HOST_MEMORY = re.compile(r"^(?P<gib>[\d.]+) GiB free host memory$")


def _host(text: str) -> str:
    """``16 free CPU cores and 64 GiB free host memory`` (scheduler.core.placement.host_text)."""
    parts = []
    for part in text.split(" and "):
        if match := _CPU.match(part):
            parts.append(gettext("%(cores)s free CPU cores") % match.groupdict())
        elif match := _HOST_MEMORY.match(part):
            parts.append(gettext("%(gib)s GiB free host memory") % match.groupdict())
        else:
            return text
    return gettext(" and ").join(parts)


def _clause(text: str) -> str:
    for pattern, template in _COMPILED:
        match = pattern.match(text)
        if match:
            values = match.groupdict()
            if "problem" in values:
                values["problem"] = _clause(values["problem"])
            if "host" in values:
                values["host"] = _host(values["host"])
            return gettext(template) % values
    return text


def localize(message: str) -> str:
    """``message`` (a sentence the scheduler stored) in the active language; unchanged in English."""
    if not message:
        return message
    position = _POSITION.match(message)
    suffix = ""
    if position:
        message = position["body"]
        suffix = gettext(" (position %(overall)s in the queue, %(mine)s among %(tenant)s's jobs)") % {
            "overall": position["overall"],
            "mine": position["mine"],
            "tenant": position["tenant"],
        }
    whole = _clause(message)
    if whole == message:  # a sentence of several clauses ("…; ask a system admin for one")
        whole = gettext("; ").join(_clause(part) for part in message.split("; "))
    return whole + suffix
