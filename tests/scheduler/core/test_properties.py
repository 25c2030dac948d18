"""Property tests (hypothesis) over small random snapshots: the invariants every plan keeps."""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core import plan
from scheduler.core.types import (
    Allocation,
    Device,
    JobKind,
    Node,
    PendingJob,
    Policy,
    Quota,
    ReplicaRequest,
    Snapshot,
    Tenant,
    Topology,
)

NOW = 100_000.0
FLAVORS = ("gpu-a", "gpu-b")
MEMORY = {"gpu-a": 16384, "gpu-b": 8192}
PRIORITIES = (0, 200, 500, 800, 1000)
TENANTS = ("org", "team-a", "team-b", "team-c")
PARENTS = {"org": None, "team-a": "org", "team-b": "org", "team-c": None}

PROPERTY_SETTINGS = settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


@st.composite
def snapshots(draw, *, flavors=FLAVORS, with_quotas=True) -> Snapshot:
    nodes = []
    for n in range(draw(st.integers(1, 4))):
        name = f"n{n}"
        devices = []
        for i in range(draw(st.integers(1, 4))):
            flavor = draw(st.sampled_from(flavors))
            devices.append(
                Device(
                    uuid=f"{name}-d{i}",
                    node=name,
                    index=i,
                    flavor=flavor,
                    memory_mib=MEMORY[flavor],
                    healthy=draw(st.booleans()) or draw(st.booleans()),
                    nvlink_domain=draw(st.sampled_from([None, "x", "y"])),
                    pcie_switch=draw(st.sampled_from([None, "p0", "p1"])),
                    numa_node=draw(st.sampled_from([None, 0, 1])),
                )
            )
        nodes.append(Node(name, tuple(devices), schedulable=draw(st.integers(0, 5)) > 0))

    allocations = []
    serial = 0
    for node in nodes:
        for dev in node.devices:
            kind = draw(st.integers(0, 3))
            if kind == 1:  # a whole card
                parts = [(1000, dev.memory_mib)]
            elif kind >= 2:  # fractions
                parts = []
                free_millis, free_mem = 1000, dev.memory_mib
                for _ in range(draw(st.integers(1, 3))):
                    millis = draw(st.integers(1, 9)) * 100
                    mem = draw(st.integers(1, 8)) * 1024
                    if millis <= free_millis and mem <= free_mem:
                        parts.append((millis, mem))
                        free_millis -= millis
                        free_mem -= mem
            else:
                parts = []
            for millis, mem in parts:
                serial += 1
                allocations.append(
                    Allocation(
                        job_id=f"run{serial}",
                        replica=0,
                        device_uuid=dev.uuid,
                        node=node.name,
                        tenant=draw(st.sampled_from(TENANTS[1:])),
                        flavor=dev.flavor,
                        millis=millis,
                        memory_mib=mem,
                        priority=draw(st.sampled_from(PRIORITIES)),
                        preemptible=draw(st.booleans()),
                        borrowed_millis=draw(st.sampled_from([0, millis])),
                        started_at=NOW - draw(st.sampled_from([10, 10_000])),
                        last_checkpoint_at=draw(st.sampled_from([None, NOW - 5])),
                        expected_end_at=draw(st.sampled_from([None, NOW + 50, NOW + 500])),
                    )
                )

    pending = []
    for j in range(draw(st.integers(0, 6))):
        if draw(st.booleans()):
            request = ReplicaRequest(
                flavors=tuple(draw(st.permutations(flavors))[: draw(st.integers(1, len(flavors)))]),
                millis=draw(st.integers(1, 9)) * 100,
                memory_mib=draw(st.integers(1, 8)) * 1024,
            )
        else:
            request = ReplicaRequest(
                flavors=(draw(st.sampled_from(flavors)),), millis=draw(st.integers(1, 3)) * 1000, memory_mib=0
            )
        kind = draw(st.sampled_from([JobKind.TRAINING, JobKind.BATCH, JobKind.INFERENCE]))
        replicas = draw(st.integers(1, 3))
        elastic = {}
        if kind == JobKind.INFERENCE:
            elastic = {
                "min_replicas": draw(st.integers(1, replicas)),
                "max_replicas": draw(st.sampled_from([None, replicas, replicas + 2])),
            }
        pending.append(
            PendingJob(
                job_id=f"job{j}",
                tenant=draw(st.sampled_from(TENANTS[1:])),
                request=request,
                priority=draw(st.sampled_from(PRIORITIES)),
                preemptible=draw(st.booleans()),
                submitted_at=float(draw(st.integers(0, 5))),
                replicas=replicas,
                topology=draw(st.sampled_from(list(Topology))),
                kind=kind,
                runtime_estimate_s=draw(st.sampled_from([None, 30.0, 1000.0])),
                **elastic,
            )
        )

    quotas = []
    if with_quotas:
        for tenant in TENANTS:
            for flavor in flavors:
                if draw(st.integers(0, 7)) == 0:
                    continue
                guaranteed = draw(st.integers(0, 12)) * 500
                limit = draw(st.sampled_from([None, guaranteed, guaranteed + 1000, guaranteed + 4000]))
                lend = draw(st.sampled_from([None, 0, 1000]))
                quotas.append(Quota(tenant, flavor, guaranteed, limit, lend))
    tenants = tuple(Tenant(t, PARENTS[t]) for t in TENANTS)
    return Snapshot(
        now=NOW,
        nodes=tuple(nodes),
        allocations=tuple(allocations),
        tenants=tenants,
        quotas=tuple(quotas),
        pending=tuple(pending),
    )


policies = st.builds(
    Policy,
    preemption=st.booleans(),
    borrowing=st.booleans(),
    fair_share=st.booleans(),
    backfill=st.booleans(),
    energy_mode=st.booleans(),
    min_runtime_before_preempt_s=st.sampled_from([0.0, 300.0]),
    require_quota=st.booleans(),
)


def _devices(snapshot: Snapshot) -> dict[str, tuple[Node, Device]]:
    return {d.uuid: (n, d) for n in snapshot.nodes for d in n.devices}


@PROPERTY_SETTINGS
@given(snapshots(), policies)
def test_no_device_is_ever_over_its_millis_or_memory_and_whole_cards_stay_exclusive(snapshot, policy):
    result = plan(snapshot, policy)
    devices = _devices(snapshot)
    millis = defaultdict(int)
    memory = defaultdict(int)
    holders = defaultdict(list)
    for a in snapshot.allocations:
        millis[a.device_uuid] += a.millis
        memory[a.device_uuid] += a.memory_mib
        holders[a.device_uuid].append(a.millis)
    for place in result.places:
        job = next(j for j in snapshot.pending if j.job_id == place.job_id)
        for a in place.assignments + place.reserved:
            node, device = devices[a.device_uuid]
            assert node.schedulable and device.healthy, "placed on an unusable device"
            assert device.flavor == place.flavor and place.flavor in job.request.flavors
            millis[a.device_uuid] += a.millis
            memory[a.device_uuid] += a.memory_mib
            holders[a.device_uuid].append(a.millis)
    for uuid, used in millis.items():
        assert used <= 1000, f"{uuid} over 1000 millis"
        assert memory[uuid] <= devices[uuid][1].memory_mib, f"{uuid} over its memory"
        if any(m >= 1000 for m in holders[uuid]):
            assert len(holders[uuid]) == 1, f"{uuid}: a whole card shared"


def _subtree_usage(snapshot: Snapshot, extra: list[tuple[str, str, int]]) -> dict[tuple[str, str], int]:
    parents = {t.name: t.parent for t in snapshot.tenants}
    usage = defaultdict(int)
    rows = [(a.tenant, a.flavor, a.millis) for a in snapshot.allocations] + extra
    for tenant, flavor, millis in rows:
        t = tenant
        while t is not None:
            usage[(t, flavor)] += millis
            t = parents.get(t)
    return usage


@PROPERTY_SETTINGS
@given(snapshots(), policies)
def test_no_tenant_goes_over_its_limit(snapshot, policy):
    result = plan(snapshot, policy)
    placed = [(p.tenant, p.flavor, sum(a.millis for a in p.assignments + p.reserved)) for p in result.places]
    before = _subtree_usage(snapshot, [])
    after = _subtree_usage(snapshot, placed)
    for q in snapshot.quotas:
        if q.limit_millis is None:
            continue
        key = (q.tenant, q.flavor)
        if after[key] > before[key]:  # the plan added usage here
            assert after[key] <= q.limit_millis, f"{q.tenant} over its {q.flavor} limit"


@PROPERTY_SETTINGS
@given(snapshots(), policies)
def test_gangs_are_placed_whole_and_each_replica_on_one_node(snapshot, policy):
    result = plan(snapshot, policy)
    jobs = {j.job_id: j for j in snapshot.pending}
    for place in result.places:
        job = jobs[place.job_id]
        replicas = defaultdict(list)
        for a in place.assignments:
            replicas[a.replica].append(a)
        placed = sorted(replicas)
        assert placed == list(range(len(placed))), "replica numbers not contiguous"
        assert job.gang_min <= len(placed) <= job.replicas, "gang not whole"
        for assignments in replicas.values():
            assert len({a.node for a in assignments}) == 1, "a replica spans nodes"
            assert len(assignments) == job.request.device_count
        if job.topology == Topology.SAME_NODE:
            assert len({a.node for a in place.assignments}) == 1
        if job.topology == Topology.NVLINK and job.request.device_count > 1:
            devices = _devices(snapshot)
            for assignments in replicas.values():
                domains = {devices[a.device_uuid][1].nvlink_domain for a in assignments}
                assert len(domains) == 1 and None not in domains


@PROPERTY_SETTINGS
@given(snapshots(), policies)
def test_every_pending_job_is_placed_or_explained_exactly_once(snapshot, policy):
    result = plan(snapshot, policy)
    placed = [p.job_id for p in result.places]
    explained = [e.job_id for e in result.explanations]
    assert sorted(placed + explained) == sorted(j.job_id for j in snapshot.pending)
    assert [e.position_overall for e in result.explanations] == list(range(1, len(explained) + 1))
    for p in result.preemptions:
        victim = next(a for a in snapshot.allocations if a.job_id == p.job_id)
        assert victim.preemptible
        assert p.victim_of in explained  # the preemptor waits for its victims


@PROPERTY_SETTINGS
@given(snapshots(), policies, st.randoms(use_true_random=False))
def test_plan_is_deterministic_whatever_the_input_order(snapshot, policy, rnd: random.Random):
    first = plan(snapshot, policy)
    assert plan(snapshot, policy) == first

    def shuffled(items):
        items = list(items)
        rnd.shuffle(items)
        return tuple(items)

    permuted = replace(
        snapshot,
        nodes=shuffled(snapshot.nodes),
        allocations=shuffled(snapshot.allocations),
        quotas=shuffled(snapshot.quotas),
        tenants=shuffled(snapshot.tenants),
        pending=shuffled(snapshot.pending),
    )
    assert plan(permuted, policy) == first


@st.composite
def priority_cases(draw):
    """One tenant with ample quota, one flavor, one pending job: only priority decides."""
    base = draw(snapshots(flavors=("gpu-a",), with_quotas=False))
    allocations = tuple(
        replace(a, tenant="team-a", borrowed_millis=0, started_at=NOW - 10_000) for a in base.allocations
    )
    request = (
        ReplicaRequest(("gpu-a",), draw(st.integers(1, 9)) * 100, draw(st.integers(1, 4)) * 1024)
        if draw(st.booleans())
        else ReplicaRequest(("gpu-a",), draw(st.integers(1, 2)) * 1000)
    )
    pending = PendingJob(
        job_id="urgent",
        tenant="team-a",
        request=request,
        priority=draw(st.sampled_from(PRIORITIES[1:])),
        replicas=draw(st.integers(1, 2)),
        topology=draw(st.sampled_from([Topology.NONE, Topology.SAME_NODE])),
    )
    quotas = (Quota("team-a", "gpu-a", 100_000),)
    return replace(base, allocations=allocations, pending=(pending,), quotas=quotas, tenants=())


@PROPERTY_SETTINGS
@given(priority_cases())
def test_higher_priority_job_never_waits_while_lower_priority_preemptible_work_holds_what_it_needs(snapshot):
    policy = Policy(min_runtime_before_preempt_s=0)
    (job,) = snapshot.pending
    movable = [a for a in snapshot.allocations if a.preemptible and a.priority < job.priority]
    without = replace(snapshot, allocations=tuple(a for a in snapshot.allocations if a not in movable))
    fits_without_them = bool(plan(without, policy).places)
    result = plan(snapshot, policy)
    movable_ids = {a.job_id for a in movable}
    assert all(p.job_id in movable_ids for p in result.preemptions), "preempted something not lower/preemptible"
    if fits_without_them:
        assert result.places or any(p.victim_of == job.job_id for p in result.preemptions)


# Preemption on and no minimum runtime, so that about one example in ten preempts and holds something.
preempting_policies = st.builds(
    Policy,
    preemption=st.just(True),
    borrowing=st.booleans(),
    fair_share=st.booleans(),
    backfill=st.booleans(),
    min_runtime_before_preempt_s=st.just(0.0),
    require_quota=st.booleans(),
)


@settings(PROPERTY_SETTINGS, max_examples=300)  # about one example in twelve preempts anything
@given(snapshots(), preempting_policies, st.data())
def test_no_job_is_preempted_past_the_ceiling(snapshot, policy, data):
    counts = {a.job_id: data.draw(st.integers(0, 4)) for a in snapshot.allocations}
    snapshot = replace(
        snapshot, allocations=tuple(replace(a, preemptions=counts[a.job_id]) for a in snapshot.allocations)
    )
    ceiling = policy.max_preemptions_per_job
    assert ceiling == 3
    for preempt in plan(snapshot, policy).preemptions:
        assert counts[preempt.job_id] < ceiling, f"{preempt.job_id} preempted {counts[preempt.job_id]} times already"


@settings(PROPERTY_SETTINGS, max_examples=150)
@given(snapshots(), preempting_policies)
def test_devices_held_for_a_preemptor_go_to_no_other_job_in_later_cycles(snapshot, policy):
    first = plan(snapshot, policy)
    holder_of = {h.device_uuid: h.job_id for h in first.holds}
    assert len(holder_of) == len(first.holds), "a device held for two jobs"
    assert {h.job_id for h in first.holds} <= {j.job_id for j in snapshot.pending}
    # Next cycle, still stopping (the victims keep their devices), then stopped (they are back in the queue).
    victims = {p.job_id for p in first.preemptions}
    placed = {p.job_id for p in first.places}
    still_pending = tuple(j for j in snapshot.pending if j.job_id not in placed)
    stopping = replace(
        snapshot,
        now=NOW + 30,
        allocations=tuple(replace(a, preemptible=False) if a.job_id in victims else a for a in snapshot.allocations),
        pending=still_pending,
        holds=first.holds,
    )
    second = plan(stopping, policy)
    # Back in the queue ahead of everyone (top priority, earliest), asking for a small fraction of any card.
    requeued = tuple(
        PendingJob(v, "team-a", ReplicaRequest(FLAVORS, 100, 1024), priority=1000, submitted_at=-1.0)
        for v in sorted(victims)
    )
    stopped = replace(
        stopping,
        now=NOW + 90,
        allocations=tuple(a for a in snapshot.allocations if a.job_id not in victims),
        pending=requeued + still_pending,
        holds=second.holds,
    )
    third = plan(stopped, policy)

    def takers(result, jobs, started_before=frozenset()) -> list[str]:
        """Jobs among ``jobs`` placed on a device held for a preemptor that has not started, in this plan or
        ``started_before``. (Once the preemptor has started — on its held devices or anywhere else — its hold is
        gone and what it left of a shared card is anybody's.)"""
        started = {p.job_id for p in result.places} | started_before
        return [
            place.job_id
            for place in result.places
            for a in place.assignments
            if place.job_id in jobs and holder_of.get(a.device_uuid, place.job_id) not in (place.job_id, *started)
        ]

    # While the victims stop, nobody else gets the held devices.
    assert takers(second, {j.job_id for j in stopping.pending}) == []
    # Once they have stopped, the requeued victims (first in the queue now) do not take them back.
    assert takers(third, victims, started_before={p.job_id for p in second.places}) == []
    # While its victims stop a preemptor picks no new victims.
    assert not any(p.victim_of in {h.job_id for h in first.holds} for p in second.preemptions)


@st.composite
def host_snapshots(draw) -> Snapshot:
    """``snapshots()`` whose nodes state their CPU and host memory and whose jobs ask for some."""
    base = draw(snapshots())
    used_cpu: dict[str, int] = defaultdict(int)
    used_mem: dict[str, int] = defaultdict(int)
    allocations = []
    for a in base.allocations:
        cpu = draw(st.sampled_from([0, 500, 4000]))
        mem = draw(st.sampled_from([0, 2048, 16384]))
        used_cpu[a.node] += cpu
        used_mem[a.node] += mem
        allocations.append(replace(a, cpu_millicores=cpu, host_memory_mib=mem))
    nodes = tuple(
        replace(
            n,
            cpu_millicores=used_cpu[n.name] + draw(st.integers(0, 8)) * 1000,
            host_memory_mib=used_mem[n.name] + draw(st.integers(0, 4)) * 8192,
        )
        for n in base.nodes
    )
    pending = tuple(
        replace(
            j,
            request=replace(
                j.request,
                cpu_millicores=draw(st.sampled_from([0, 1000, 3000, 6000])),
                host_memory_mib=draw(st.sampled_from([0, 4096, 20000])),
            ),
        )
        for j in base.pending
    )
    return replace(base, nodes=nodes, allocations=tuple(allocations), pending=pending)


@PROPERTY_SETTINGS
@given(host_snapshots(), policies)
def test_no_node_is_ever_over_its_cpu_or_host_memory_and_every_replica_gets_its_share(snapshot, policy):
    result = plan(snapshot, policy)
    nodes = {n.name: n for n in snapshot.nodes}
    cpu: dict[str, int] = defaultdict(int)
    mem: dict[str, int] = defaultdict(int)
    for a in snapshot.allocations:
        cpu[a.node] += a.cpu_millicores
        mem[a.node] += a.host_memory_mib
    for place in result.places:
        job = next(j for j in snapshot.pending if j.job_id == place.job_id)
        rows = place.assignments + place.reserved
        for a in rows:
            cpu[a.node] += a.cpu_millicores
            mem[a.node] += a.host_memory_mib
        replicas = len({a.replica for a in rows})
        assert sum(a.cpu_millicores for a in rows) == job.request.cpu_millicores * replicas
        assert sum(a.host_memory_mib for a in rows) == job.request.host_memory_mib * replicas
        for replica in {a.replica for a in rows}:
            assert len({a.node for a in rows if a.replica == replica}) == 1, "a replica spans nodes"
    for name, used in cpu.items():
        assert used <= nodes[name].cpu_millicores, f"{name} over its CPU"
        assert mem[name] <= nodes[name].host_memory_mib, f"{name} over its host memory"
