"""gpupool's trace format: files round-trip, bad rows are refused with their line, guarantees come from the
window when no tenants file is given, and a replay writes per-job and per-tenant CSVs."""

from __future__ import annotations

import csv
import re
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest

from scheduler.core.types import PriorityClass, Topology
from scheduler.sim import SimConfig, SimJob, Workload, policies, simulate
from scheduler.sim import traceformat as tf
from scheduler.sim.cli import main
from scheduler.sim.loaders import load_alibaba, load_philly
from scheduler.sim.metrics import summarize
from scheduler.sim.records import JobTimeline, job_rows, tenant_rows
from scheduler.sim.workload import node, uniform_nodes

FIXTURES = Path(__file__).parent / "fixtures" / "traces"
FAST = SimConfig(cycle_interval_s=1.0)


def varied_workload() -> Workload:
    """Every column in use: fractions and gangs, host resources, two flavors, a tenant tree with all quota parts."""
    nodes = (
        node("big", 8, flavor="h100", memory_mib=81920, cpu_millicores=64000, host_memory_mib=524288),
        node("small", 2, flavor="t4", memory_mib=15360),
    )
    jobs = (
        SimJob("j1", "team-a", 0.0, 3600.0, millis=2000, replicas=2, flavors=("h100",), topology=Topology.NVLINK),
        SimJob(
            "j2",
            "team-b",
            12.5,
            90.25,
            millis=300,
            memory_mib=4096,
            flavors=("t4", "h100"),
            priority=PriorityClass.HIGH,
            preemptible=False,
            cpu_millicores=1500,
            host_memory_mib=8192,
            runtime_estimate_s=120.0,
        ),
        SimJob("j3", "team-a", 60.0, 10.0, priority=650, flavors=("h100",)),
    )
    return Workload(
        "varied",
        nodes,
        jobs,
        guarantees={"org": {"h100": 8000, "t4": 2000}, "team-a": {"h100": 6000}, "team-b": {"t4": 2000}},
        limits={"org": {"h100": 8000, "t4": None}, "team-a": {"h100": 8000}, "team-b": {"t4": 2000}},
        parents={"org": None, "team-a": "org", "team-b": "org"},
        lending_limits={"team-a": {"h100": 1000}},
        max_running_jobs={"team-b": {"t4": 4}},
    )


@pytest.mark.parametrize("fmt", tf.FORMATS)
def test_jobs_cluster_and_tenants_read_back_as_they_were_written(tmp_path, fmt):
    original = varied_workload()
    files = tf.write_workload(original, tmp_path, fmt)

    back = tf.load_trace(files["jobs"], files["cluster"], files["tenants"])

    assert back.jobs == original.jobs
    assert back.nodes == original.nodes
    assert back.guarantees == original.guarantees
    assert back.limits == original.limits
    assert back.parents == original.parents
    assert back.lending_limits == original.lending_limits
    assert back.max_running_jobs == original.max_running_jobs


def test_a_csv_written_by_hand_with_defaults_reads_as_documented(tmp_path):
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("job_id,submit_s,tenant,cards,duration_s\nx,5,t,2,100\n")

    [job] = tf.read_jobs(jobs)

    assert (job.replicas, job.millis, job.priority, job.preemptible) == (1, 2000, 500, True)
    assert job.flavors == () and job.topology == Topology.NONE and job.runtime_estimate_s is None


def test_bundled_philly_trace_converts_and_replays_the_same(tmp_path):
    philly = load_philly(FIXTURES, start=datetime(2017, 10, 1), days=1, cluster=32)
    files = tf.write_workload(philly, tmp_path)
    converted = tf.load_trace(files["jobs"], files["cluster"], files["tenants"])

    policy = policies.get("gpupool")
    before, after = summarize(simulate(philly, policy, FAST)), summarize(simulate(converted, policy, FAST))
    for key in ("jobs", "finished", "jct_avg_s", "queued_avg_s", "gpu_hours", "preemptions", "gpus"):
        assert after[key] == before[key], key


def test_bundled_alibaba_trace_keeps_fractions_host_resources_and_models(tmp_path):
    alibaba = load_alibaba(FIXTURES)
    files = tf.write_workload(alibaba, tmp_path, "jsonl")

    converted = tf.load_trace(files["jobs"], files["cluster"], files["tenants"])

    # The format keeps the request as the engine takes it (455 millis would be rounded up to 460), not the raw value.
    assert converted.jobs == tuple(replace(j, trace_millis=None) for j in alibaba.jobs)
    assert converted.nodes == alibaba.nodes
    assert converted.guarantees == alibaba.guarantees


BAD_JOBS = [
    ("job_id,submit_s,tenant,cards,duration_s\na,0,t,1,10\nb,soon,t,1,10\n", "line 3, column 'submit_s'"),
    ("job_id,submit_s,tenant,cards,duration_s\na,0,t,,10\n", "line 2, column 'cards': give the cards"),
    ("job_id,submit_s,tenant,millis,duration_s\na,0,t,300,10\n", "line 2, column 'millis'"),
    ("job_id,submit_s,tenant,millis,duration_s\na,0,t,355,10\n", "multiple of 10"),
    ("job_id,submit_s,tenant,cards,duration_s\na,0,t,1,10\na,1,t,1,10\n", "line 3, column 'job_id'"),
    ("job_id,submit_s,tenant,cards,duration_s,preemptable\na,0,t,1,10,no\n", "line 1: unknown column 'preemptable'"),
    ("job_id,submit_s,tenant,cards\na,0,t,1\n", "line 1: the header lacks the required column 'duration_s'"),
    ("job_id,submit_s,tenant,cards,duration_s,priority\na,0,t,1,10,urgent\n", "line 2, column 'priority'"),
    ("job_id,submit_s,tenant,cards,duration_s,preemptible\na,0,t,1,10,maybe\n", "expected true or false"),
    ("job_id,submit_s,tenant,cards,duration_s\na,0,t,1,0\n", "line 2, column 'duration_s': must be more than 0"),
    ("job_id,submit_s,tenant,cards,duration_s\na,0,t,1.5,10\n", "expected a whole number"),
    ("job_id,submit_s,tenant,cards,duration_s,topology\na,0,t,1,10,ring\n", "line 2, column 'topology'"),
]


@pytest.mark.parametrize(("text", "message"), BAD_JOBS)
def test_a_bad_jobs_row_is_refused_naming_its_line_and_column(tmp_path, text, message):
    jobs = tmp_path / "jobs.csv"
    jobs.write_text(text)

    with pytest.raises(tf.TraceFormatError, match=r"jobs\.csv line") as error:
        tf.read_jobs(jobs)
    assert message in str(error.value)


def test_a_bad_json_lines_row_is_refused_naming_its_line(tmp_path):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"job_id": "a", "submit_s": 0, "tenant": "t", "cards": 1, "duration_s": 5}\n\n{"job_id": "b",\n')

    with pytest.raises(tf.TraceFormatError, match=r"jobs.jsonl line 3: not valid JSON"):
        tf.read_jobs(jobs)


def test_jobs_that_could_never_run_on_the_cluster_or_under_the_tenants_are_refused(tmp_path):
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("job_id,submit_s,tenant,cards,duration_s,flavors\na,0,t,1,10,h100\nb,0,u,1,10,a100|t4\n")
    cluster = tmp_path / "cluster.csv"
    cluster.write_text("node,cards,flavor,memory_mib\nn,8,h100,81920\n")
    tenants = tmp_path / "tenants.csv"
    tenants.write_text("tenant,flavor,guaranteed_millis\nt,h100,8000\n")

    with pytest.raises(tf.TraceFormatError, match=r"line 3, column 'flavors': .*a100\|t4.*\(h100\)"):
        tf.load_trace(jobs, cluster)
    jobs.write_text("job_id,submit_s,tenant,cards,duration_s\na,0,t,1,10\nb,0,u,1,10\n")
    with pytest.raises(tf.TraceFormatError, match="line 3, column 'tenant': 'u' is not in"):
        tf.load_trace(jobs, cluster, tenants)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tenant,parent\na,b\n", "line 2, column 'parent': 'b' is not a tenant of this file"),
        ("tenant,parent\na,b\nb,a\n", "is its own ancestor"),
        ("tenant,flavor,guaranteed_millis\na,h100,1\na,h100,2\n", "line 3, column 'flavor'"),
        ("tenant,guaranteed_millis\na,1000\n", "line 2, column 'guaranteed_millis': a quota needs its flavor"),
    ],
)
def test_a_bad_tenants_file_is_refused(tmp_path, text, message):
    tenants = tmp_path / "tenants.csv"
    tenants.write_text(text)

    with pytest.raises(tf.TraceFormatError) as error:
        tf.read_tenants(tenants)
    assert message in str(error.value)


def test_a_node_stated_twice_with_different_host_resources_is_refused(tmp_path):
    cluster = tmp_path / "cluster.csv"
    cluster.write_text("node,cards,flavor,memory_mib,cpu_cores\nn,4,h100,81920,64\nn,2,t4,15360,32\n")

    with pytest.raises(tf.TraceFormatError, match="line 3, column 'cpu_cores'"):
        tf.read_cluster(cluster)


def test_cluster_rows_with_a_count_make_that_many_nodes_and_split_nvlink_domains(tmp_path):
    cluster = tmp_path / "cluster.csv"
    cluster.write_text("node,count,cards,flavor,memory_mib,nvlink_domains\nrack,3,8,h100,81920,2\nx,,1,t4,15360,0\n")

    nodes = tf.read_cluster(cluster)

    assert [n.name for n in nodes] == ["rack-1", "rack-2", "rack-3", "x"]
    assert {d.nvlink_domain for d in nodes[0].devices} == {"rack-1:nvl0", "rack-1:nvl1"}
    assert nodes[3].devices[0].nvlink_domain is None


def test_without_a_tenants_file_guarantees_follow_each_tenants_gpu_time_on_each_flavor():
    nodes = (*uniform_nodes(1, 8, flavor="h100", prefix="h"), *uniform_nodes(1, 4, flavor="t4", prefix="t"))
    jobs = [
        SimJob("a", "heavy", 0, 3000, flavors=("h100",)),
        SimJob("b", "light", 0, 1000, flavors=("h100",)),
        SimJob("c", "light", 0, 500, flavors=("t4", "h100")),  # counts half on each flavor
    ]

    spec = tf.derive_guarantees(jobs, nodes)

    # h100 weights: heavy 3000, light 1000 + 250 → 8 cards split 6:2 (largest remainder).
    assert spec.guarantees["heavy"] == {"h100": 6000, "t4": 0}
    assert spec.guarantees["light"] == {"h100": 2000, "t4": 4000}
    assert spec.limits["heavy"] == {"h100": 8000, "t4": 4000}


def test_without_a_cluster_file_the_cluster_holds_the_peak_demand_in_whole_nodes(tmp_path):
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("job_id,submit_s,tenant,cards,duration_s\na,0,t,6,100\nb,50,t,6,100\nc,200,u,1,10\n")

    workload = tf.load_trace(jobs)

    assert workload.meta["gpus"] == 16  # a and b overlap: 12 cards at the peak, in 8-card nodes
    assert workload.guarantees == {"t": {"gpu": 16000}, "u": {"gpu": 0}}
    assert {j.flavors for j in workload.jobs} == {("gpu",)}


def preempted_borrower() -> Workload:
    """tests/scheduler/sim/test_simulator.py's scenario: c reclaims the card b borrowed at t=10."""
    return Workload(
        "tiny",
        uniform_nodes(2, 1),
        (SimJob("a", "t1", 0, 100), SimJob("b", "t1", 0, 100), SimJob("c", "t2", 10, 50)),
        guarantees={"t1": {"gpu": 1000}, "t2": {"gpu": 1000}},
        limits={"t1": {"gpu": 2000}, "t2": {"gpu": 2000}},
    )


def test_the_timeline_records_every_run_of_a_preempted_job():
    policy = policies.get("gpupool", min_runtime_before_preempt_s=0, grace_period_s=5, borrow_backoff_s=None)
    config = SimConfig(cycle_interval_s=1.0, restart_cost_s=3, checkpoint_interval_s=4)
    timeline = JobTimeline()
    result = simulate(preempted_borrower(), policy, config, observers=[timeline])

    rows = {row["job_id"]: row for row in job_rows(result, timeline)}

    b = rows["b"]
    # b: 0..15 (preempted at 10, 5 s grace), waits 15..65 while c runs, then 3 s restart + 88 s: done at 156.
    assert b["runs"].split(";") == [
        f"0-15@{b['nodes']}:preempted",
        f"65-156@{b['nodes']}:finished",
    ]
    assert (b["starts"], b["preemptions"], b["queued_s"], b["run_s"], b["completion_s"]) == (2, 1, 50, 106, 156)
    assert rows["c"]["runs"].endswith(":finished") and rows["c"]["queued_s"] == 5
    tenants = {row["tenant"]: row for row in tenant_rows(result)}
    assert tenants["t1"]["preemptions"] == 1 and tenants["t1"]["finished"] == 2
    assert tenants["t1"]["gpu_hours"] == pytest.approx(200 / 3600)


def test_cli_replays_a_trace_file_and_writes_per_job_and_per_tenant_csvs(tmp_path, capsys):
    files = tf.write_workload(preempted_borrower(), tmp_path / "trace")
    jobs_csv, tenants_csv = tmp_path / "per-job.csv", tmp_path / "per-tenant.csv"

    code = main(
        [
            "--trace-file",
            str(files["jobs"]),
            "--cluster-file",
            str(files["cluster"]),
            "--tenants-file",
            str(files["tenants"]),
            "--policy",
            "fifo,gpupool",
            "--cycle-interval",
            "1",
            "--jobs-csv",
            str(jobs_csv),
            "--tenants-csv",
            str(tenants_csv),
        ]
    )

    assert code == 0
    assert "gpupool" in capsys.readouterr().out
    with jobs_csv.open() as fh:
        job_table = list(csv.DictReader(fh))
    assert [(r["policy"], r["job_id"]) for r in job_table] == [
        (p, j) for p in ("fifo", "gpupool") for j in ("a", "b", "c")
    ]
    fifo_c = job_table[2]
    assert (fifo_c["submit_s"], fifo_c["first_start_s"], fifo_c["queued_s"]) == ("10", "100", "90")
    assert fifo_c["runs"].startswith("100-150@") and fifo_c["runs"].endswith(":finished")
    with tenants_csv.open() as fh:
        tenant_table = list(csv.DictReader(fh))
    assert [(r["policy"], r["tenant"], r["jobs"]) for r in tenant_table] == [
        ("fifo", "t1", "2"),
        ("fifo", "t2", "1"),
        ("gpupool", "t1", "2"),
        ("gpupool", "t2", "1"),
    ]


def test_cli_says_what_is_wrong_with_a_trace_file(tmp_path):
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("job_id,submit_s,tenant,cards,duration_s\na,0,t,x,10\n")

    with pytest.raises(SystemExit, match=r"jobs\.csv line 2, column 'cards'"):
        main(["--trace-file", str(jobs)])


DOCS = Path(__file__).resolve().parents[3] / "docs" / "trace-format.md"


def test_the_documented_examples_read_and_every_column_is_documented(tmp_path):
    text = DOCS.read_text()
    blocks = re.findall(r"```(csv|json)\n(.*?)```", text, re.S)
    for (_, body), name in zip(blocks, ["jobs.csv", "jobs.jsonl", "cluster.csv", "tenants.csv"], strict=False):
        (tmp_path / name).write_text(body)

    workload = tf.load_trace(tmp_path / "jobs.csv", tmp_path / "cluster.csv", tmp_path / "tenants.csv")

    assert tf.read_jobs(tmp_path / "jobs.jsonl") == list(workload.jobs)
    assert len(workload.nodes) == 17 and workload.parents["vision"] == "acme"
    for column in (*tf.JOB_COLUMNS, *tf.CLUSTER_COLUMNS, *tf.TENANT_COLUMNS):
        assert f"| `{column.name}` |" in text, column.name
