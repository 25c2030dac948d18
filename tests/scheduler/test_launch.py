"""The launch contract (scheduler/launch.py): what each replica is told, the ports a gang reserves when it is bound,
a node whose port range is used up, and ports coming back when a replica's cards do (issue 30)."""

from __future__ import annotations

import json

import pytest

from scheduler.core import types as core
from scheduler.fleet.models import AgentCommand
from scheduler.fleet.services.workload_reports import workload_status_report
from scheduler.launch import Launch, Site, launch_env
from scheduler.models import Allocation, Job, JobState, ReplicaPort
from scheduler.persist import persist_plan
from scheduler.services.jobs import job_cancel, job_submit
from tests.scheduler.factories import node_with_devices

GANG = {
    "name": "gang",
    "tenant": "team-a",
    "replicas": 2,
    "resources": {"flavors": ["sim-80g"], "gpus": 2},
    "command": ["python3", "train.py"],
}


@pytest.fixture(autouse=True)
def _quiet(no_cycle_requests):
    return no_cycle_requests


def _layout() -> Launch:
    """Three replicas: 0 and 1 on node 7 (10.0.0.7), 2 on node 9 (10.0.0.9); two cards each."""
    return Launch(
        master_address="10.0.0.7",
        master_port=29501,
        sites=(
            Site(0, 7, "10.0.0.7", 29500, 2),
            Site(1, 7, "10.0.0.7", 29502, 2),
            Site(2, 9, "10.0.0.9", 29500, 2),
        ),
        token="t0ken",
    )


def test_each_replica_is_told_its_rank_its_place_on_the_node_and_where_the_master_is():
    envs = [launch_env(_layout(), replica=r, replicas=3) for r in range(3)]
    assert [e["RANK"] for e in envs] == ["0", "1", "2"]
    assert {e["WORLD_SIZE"] for e in envs} == {"3"}
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("10.0.0.7", "29501")}
    assert [(e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["NODE_RANK"]) for e in envs] == [
        ("0", "2", "0"),
        ("1", "2", "0"),
        ("0", "1", "1"),
    ]
    # torchrun: each replica is one of its nodes, one process per card.
    assert [(e["PET_NNODES"], e["PET_NODE_RANK"], e["PET_NPROC_PER_NODE"]) for e in envs] == [
        ("3", "0", "2"),
        ("3", "1", "2"),
        ("3", "2", "2"),
    ]
    assert {e["PET_MASTER_ADDR"] + ":" + e["PET_MASTER_PORT"] for e in envs} == {"10.0.0.7:29501"}
    tf = [json.loads(e["TF_CONFIG"]) for e in envs]
    assert tf[2] == {
        "cluster": {"worker": ["10.0.0.7:29500", "10.0.0.7:29502", "10.0.0.9:29500"]},
        "task": {"type": "worker", "index": 2},
    }
    assert [(e["JAX_COORDINATOR_ADDRESS"], e["JAX_PROCESS_ID"], e["JAX_NUM_PROCESSES"]) for e in envs][1] == (
        "10.0.0.7:29501",
        "1",
        "3",
    )
    assert [e["GPUPOOL_PORT"] for e in envs] == ["29500", "29502", "29500"]
    assert envs[0]["GPUPOOL_HOSTS"] == "10.0.0.7:4,10.0.0.9:2"


def test_the_hostfile_has_a_line_per_node_with_its_processes_in_node_rank_order():
    assert _layout().hostfile() == "10.0.0.7 slots=4\n10.0.0.9 slots=2\n"
    assert _layout().peer_addresses() == ["10.0.0.7", "10.0.0.9"]


def _place(job: Job, *replica_nodes) -> core.Place:
    assignments = []
    for replica, node in enumerate(replica_nodes):
        taken = {a.device_uuid for a in assignments}
        devices = [d for d in node.devices.order_by("index") if d.uuid not in taken]
        taken_here = Allocation.objects.active().filter(node=node).values_list("device__uuid", flat=True)
        devices = [d for d in devices if d.uuid not in set(taken_here)][:2]
        assignments += [core.Assignment(replica, node.name, d.uuid, 1000, 0) for d in devices]
    return core.Place(job_id=str(job.pk), tenant="team-a", flavor="sim-80g", assignments=tuple(assignments))


def _starts(job: Job) -> dict[int, dict]:
    rows = AgentCommand.objects.filter(job=job, command_type="workload.start")
    return {row.payload["replica"]: row.payload for row in rows}


def test_a_bound_gang_holds_a_port_per_replica_and_its_master_port_on_replica_0s_node(member, flavor):
    first = node_with_devices(4, name="gpu-a", address="10.1.0.1")
    second = node_with_devices(4, name="gpu-b", address="10.1.0.2")
    job = job_submit(actor=member, spec=GANG)
    assert persist_plan(core.Plan(places=(_place(job, first, second),))).placed == [job.pk]

    held = sorted(ReplicaPort.objects.filter(job=job).values_list("node__name", "replica", "purpose"))
    assert held == [("gpu-a", 0, "rendezvous"), ("gpu-a", 0, "replica"), ("gpu-b", 1, "replica")]
    starts = _starts(job)
    master = ReplicaPort.objects.get(job=job, purpose="rendezvous")
    for replica, start in starts.items():
        assert start["env"]["MASTER_ADDR"] == "10.1.0.1" and start["env"]["MASTER_PORT"] == str(master.port)
        assert start["env"]["RANK"] == str(replica)
        assert start["hostfile"] == "10.1.0.1 slots=2\n10.1.0.2 slots=2\n"
        assert start["peer_addresses"] == ["10.1.0.1", "10.1.0.2"]


def test_two_gangs_on_one_node_never_hold_the_same_port(member, flavor):
    node = node_with_devices(8, name="gpu-a", address="10.1.0.1")
    jobs = [job_submit(actor=member, spec=GANG) for _ in range(2)]
    persist_plan(core.Plan(places=(_place(jobs[0], node, node),)))
    persist_plan(core.Plan(places=(_place(jobs[1], node, node),)))
    ports = list(ReplicaPort.objects.filter(node=node).values_list("port", flat=True))
    assert len(ports) == 6 == len(set(ports))
    assert Job.objects.filter(state=JobState.ADMITTED).count() == 2


def test_a_node_out_of_ports_keeps_the_gang_queued_saying_so_and_its_ports_come_back(member, flavor, settings):
    node = node_with_devices(8, name="gpu-a", job_port_first=40000, job_port_last=40003)
    holder, waiting = (job_submit(actor=member, spec=GANG) for _ in range(2))
    persist_plan(core.Plan(places=(_place(holder, node, node),)))  # 3 of the 4 ports
    outcome = persist_plan(core.Plan(places=(_place(waiting, node, node),)))

    assert outcome.placed == []
    waiting.refresh_from_db()
    assert waiting.state == JobState.QUEUED  # pending, never failed
    assert waiting.pending_reason_code == core.PendingReason.PORTS_EXHAUSTED
    assert "Node gpu-a has no free port in its job port range (40000-40003" in waiting.pending_message
    assert not Allocation.objects.filter(job=waiting).exists()

    # The holder's replicas end (their agent reported the processes gone): the ports are free again.
    Allocation.objects.filter(job=holder).update(ended_at=holder.submitted_at)
    assert persist_plan(core.Plan(places=(_place(waiting, node, node),))).placed == [waiting.pk]
    assert set(ReplicaPort.objects.values_list("job_id", flat=True)) == {waiting.pk}


def test_a_cancelled_replica_keeps_its_cards_until_its_agent_reports_the_process_ended(member, flavor):
    node = node_with_devices(4, name="gpu-a")
    job = job_submit(actor=member, spec={**GANG, "replicas": 1})
    persist_plan(core.Plan(places=(_place(job, node),)))
    AgentCommand.objects.filter(job=job, command_type="workload.start").update(acked_at=job.submitted_at)

    job_cancel(actor=member, job=job)
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert Allocation.objects.active().filter(job=job).count() == 2  # the process may still run
    assert AgentCommand.objects.filter(job=job, command_type="workload.stop").count() == 1

    workload_status_report(node=node, job_id=job.pk, replica=0, state="stopped", exit_code=143, last_checkpoint_at=None)
    assert not Allocation.objects.active().filter(job=job).exists()


def test_a_cancelled_replica_whose_start_no_agent_acknowledged_frees_its_cards_at_once(member, flavor):
    node = node_with_devices(4, name="gpu-a")
    job = job_submit(actor=member, spec={**GANG, "replicas": 1})
    persist_plan(core.Plan(places=(_place(job, node),)))
    job_cancel(actor=member, job=job)
    assert not Allocation.objects.active().filter(job=job).exists()
