"""The job commands: ``submit``, ``ls`` (``queue``), ``show``, ``logs``, ``cancel``."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from gpupool_client.cli.app import api_command, cli, current_state, json_option, print_error, print_json
from gpupool_client.cli.output import (
    STATE_STYLES,
    clip,
    console,
    duration_text,
    gpus_text,
    local_time,
    relative_text,
)
from gpupool_client.client import Client
from gpupool_client.errors import EXIT_OK, ApiError, NotFoundError
from gpupool_client.models import ACTIVE_STATES, FINAL_STATES, MILLIS_PER_CARD, Job
from gpupool_client.spec import PRIORITIES, build_spec, command_text, load_spec_file

JOB_STATES = (
    "submitted",
    "pending_approval",
    "queued",
    "admitted",
    "running",
    "preempting",
    "succeeded",
    "failed",
    "cancelled",
    "node_lost",
)
#: What ``ls`` shows without ``--state`` or ``--all``: like squeue, the jobs that have not ended.
UNFINISHED_STATES = tuple(state for state in JOB_STATES if state not in FINAL_STATES)
#: Jobs whose nodes ``ls`` and ``top`` look up one by one (the list endpoint does not carry allocations).
MAX_DETAIL_LOOKUPS = 50


@cli.command(context_settings={"allow_interspersed_args": False})
@click.option("-f", "--file", "spec_file", type=click.Path(dir_okay=False), help="A job spec (YAML or JSON).")
@click.option("--name", help="Job name (default: from the command, e.g. train for python train.py).")
@click.option("--tenant", help="Tenant slug (needed when you belong to several).")
@click.option("--gpus", type=click.IntRange(1, 64), help="Whole cards per replica.")
@click.option("--fraction", type=float, help="Part of one card per replica: 0.1 to 0.99 (needs --memory).")
@click.option("--memory", metavar="SIZE", help="Device memory per replica, e.g. 8Gi (with --fraction).")
@click.option(
    "--flavor",
    "flavors",
    multiple=True,
    metavar="FLAVOR",
    help="Card flavor; repeat for several, in order of preference.",
)
@click.option(
    "--any-flavor",
    is_flag=True,
    default=None,
    help="The --flavor cards are alternatives: the pool picks where it fits best.",
)
@click.option("--replicas", type=click.IntRange(1, 256), help="Gang size: all replicas start together or none.")
@click.option("--priority", type=click.Choice(PRIORITIES), help="Priority class (default normal).")
@click.option("--cpus", type=click.FloatRange(0, 1024), help="CPU cores per replica.")
@click.option("--mem", metavar="SIZE", help="Host memory per replica, e.g. 64Gi.")
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE", help="Environment variable; repeatable.")
@click.option("--array", metavar="0-N", help="Submit N+1 independent jobs (GPUPOOL_ARRAY_INDEX=0..N).")
@click.option("--kind", type=click.Choice(["training", "inference", "interactive", "batch"]))
@click.option(
    "--launcher",
    type=click.Choice(["none", "mpi"]),
    help="mpi: the command (mpirun ...) runs on replica 0; the other replicas host its ranks.",
)
@click.option("--max-runtime", "max_runtime_s", type=click.IntRange(1), metavar="SECONDS", help="Stop it after this.")
@click.option("--idempotency-key", metavar="KEY", help="Reuse a key to retry a submit safely (default: a new UUID).")
@click.option("--dry-run", is_flag=True, help="Print the spec that would be sent, and send nothing.")
@click.option("-q", "--quiet", is_flag=True, help="Print only the job id(s), one a line.")
@json_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@api_command
def submit(
    spec_file: str | None,
    command: Sequence[str],
    idempotency_key: str | None,
    dry_run: bool,
    quiet: bool,
    as_json: bool,
    **options: Any,
) -> None:
    """Submit a job: options, then -- and the command.

    \b
      gpupool-cli submit --gpus 2 --flavor nvidia-h100-80g -- python train.py --epochs 10
      gpupool-cli submit --fraction 0.3 --memory 8Gi -- python infer.py
      gpupool-cli submit --replicas 2 --gpus 8 -- torchrun train.py
      gpupool-cli submit --replicas 2 --gpus 8 --launcher mpi -- mpirun python3 train.py
      gpupool-cli submit --array 0-99 --fraction 0.1 --memory 2Gi -- python sweep.py
      gpupool-cli submit -f job.yaml --priority high
    """
    base = load_spec_file(spec_file) if spec_file else None
    spec = build_spec(base=base, command=command, **options)
    if dry_run:
        print_json(spec)
        return
    client = current_state().client()
    resources = spec["resources"]
    if not resources.get("flavors") and not resources.get("flavor"):
        resources["flavors"] = [_only_flavor(client)]
    result = client.submit(spec, idempotency_key=idempotency_key)
    if as_json:
        body = (result.array or result.job).raw  # type: ignore[union-attr]
        print_json({**body, "idempotency_key": result.idempotency_key, "replayed": result.replayed})
        return
    if quiet:
        click.echo("\n".join(str(job_id) for job_id in result.job_ids))
        return
    again = " (already submitted with this key: nothing new was created)" if result.replayed else ""
    if result.array is not None:
        array = result.array
        click.echo(
            f"Submitted array {array.array_id}: {array.count} tasks (task 0 is job {array.first_job_id}) "
            f"to {array.tenant} ({array.state}){again}."
        )
    else:
        job = result.job
        assert job is not None
        reason = f": {job.pending_reason}" if job.pending_reason else ""
        click.echo(f"Submitted job {job.id} to {job.tenant} ({job.state}){again}{reason}")


def _flavors_text(job: Job) -> str:
    """``a, b`` for flavors tried in that order, ``a or b (whichever fits the pool best)`` for alternatives."""
    if job.any_flavor and len(job.flavors) > 1:
        return " or ".join(job.flavors) + " (whichever fits the pool best)"
    return ", ".join(job.flavors)


def _only_flavor(client: Client) -> str:
    """The flavor to ask for when none was named: the pool's only one; with several, the user must choose."""
    names = [flavor.name for flavor in client.flavors()]
    if len(names) == 1:
        return names[0]
    known = ", ".join(names) or "none are defined yet"
    raise click.UsageError(f"say which cards with --flavor (this pool has several: {known}).")


# --- ls / queue ------------------------------------------------------------------------------------------------


@cli.command("ls")
@click.option("--state", "states", multiple=True, type=click.Choice(JOB_STATES), help="Only these states.")
@click.option("-a", "--all", "all_states", is_flag=True, help="Include ended jobs (default: unfinished only).")
@click.option("--tenant", help="Only this tenant's jobs.")
@click.option("--user", "submitter", help="Only this user's jobs.")
@click.option("--mine", is_flag=True, help="Only your jobs.")
@click.option("--name", help="Name contains this.")
@click.option("--array", "array_id", metavar="ARRAY_ID", help="Only the jobs of this array.")
@click.option("--kind", type=click.Choice(["training", "inference", "interactive", "batch"]))
@click.option("-n", "--limit", type=click.IntRange(1), default=200, show_default=True, help="At most this many.")
@json_option
@api_command
def ls(
    states: Sequence[str],
    all_states: bool,
    tenant: str | None,
    submitter: str | None,
    mine: bool,
    name: str | None,
    array_id: str | None,
    kind: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List jobs like squeue: state, why it waits, queue position, expected start, nodes, elapsed."""
    client = current_state().client()
    if mine:
        submitter = client.me().username
    wanted = list(states) or ([] if all_states or array_id else list(UNFINISHED_STATES))
    pages = client.jobs(
        state=wanted, tenant=tenant, submitter=submitter, name=name, kind=kind, array=array_id, limit=limit
    )
    jobs = pages.all()
    if as_json:
        print_json([job.raw for job in jobs])
        return
    if not jobs:
        click.echo("No jobs." if all_states or states else "No unfinished jobs (--all shows ended ones).")
    else:
        nodes = _nodes_of(client, jobs)
        console().print(_jobs_table(jobs, nodes, now=datetime.now(UTC)))
        if pages.total is not None and pages.total > len(jobs):
            click.echo(f"{len(jobs)} of {pages.total} jobs shown; --limit {pages.total} shows them all.", err=True)
    if array_id:
        waiting = client.array_state(array_id)
        if waiting.not_yet_jobs:
            # squeue's one line for an array's pending tasks (1234_[64-999]).
            click.echo(f"Also queued, not jobs yet: tasks {waiting.not_yet_jobs} of array {waiting.array_id}.")


@cli.command()
@click.argument("array_id")
@json_option
@api_command
def array(array_id: str, as_json: bool) -> None:
    """An array's tasks counted by state (tasks that are not jobs yet count as queued)."""
    state = current_state().client().array_state(array_id)
    if as_json:
        print_json(state.raw)
        return
    counts = ", ".join(f"{n} {name}" for name, n in sorted(state.states.items()))
    click.echo(f"Array {state.array_id} ({state.name}, {state.tenant}): {state.count} tasks: {counts}.")
    if state.not_yet_jobs:
        click.echo(f"Queued, not jobs yet: tasks {state.not_yet_jobs}.")


cli.add_command(ls, "queue")


def _nodes_of(client: Client, jobs: Sequence[Job]) -> dict[int, tuple[str, ...]]:
    """Nodes of the jobs holding cards: from the row when the server lists them, else from the job's detail
    (for the first MAX_DETAIL_LOOKUPS such jobs)."""
    result: dict[int, tuple[str, ...]] = {}
    lookups = 0
    for job in jobs:
        if job.state not in ACTIVE_STATES:
            continue
        if "nodes" in job.raw:
            result[job.id] = job.nodes
        elif lookups < MAX_DETAIL_LOOKUPS:
            lookups += 1
            try:
                result[job.id] = client.job(job.id).nodes
            except NotFoundError:  # ended and gone between the list and now
                continue
    return result


def _jobs_table(jobs: Sequence[Job], nodes: dict[int, tuple[str, ...]], *, now: datetime) -> Table:
    with_estimate = any("estimated_start_at" in job.raw for job in jobs)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    columns = ["JOBID", "NAME", "TENANT", "USER", "STATE", "REASON", "POS", "GPUS", "NODES", "ELAPSED"]
    if with_estimate:
        columns.insert(7, "EST.START")
    for column in columns:
        table.add_column(column, no_wrap=True, justify="right" if column in ("JOBID", "ELAPSED") else "left")
    for job in jobs:
        position = f"{job.position_in_tenant}/{job.position_overall}" if job.position_in_tenant else ""
        reason = job.pending_reason_code if job.is_pending else (job.state_message if job.is_final else "")
        row = [
            str(job.id),
            clip(job.name, 24),
            job.tenant,
            job.submitter or "",
            Text(job.state, style=STATE_STYLES.get(job.state, "")),
            clip(reason, 28),
            position,
            gpus_text(job),
            clip(",".join(nodes.get(job.id, ())), 30),
            duration_text(job.elapsed_s(now)),
        ]
        if with_estimate:
            row.insert(7, relative_text(job.estimated_start_at, now) if job.is_pending else "")
        table.add_row(*row)
    return table


# --- show, logs, cancel -----------------------------------------------------------------------------------------


@cli.command()
@click.argument("job_id", type=int)
@json_option
@api_command
def show(job_id: int, as_json: bool) -> None:
    """One job: its state and why, resources, command, allocations and history."""
    job = current_state().client().job(job_id)
    if as_json:
        print_json(job.raw)
        return
    now = datetime.now(UTC)
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    state = Text(job.state, style=STATE_STYLES.get(job.state, ""))
    if job.state_message:
        state.append(f"  {job.state_message}")
    lines: list[tuple[str, Any]] = [
        ("Job", f"{job.id}  {job.name}"),
        ("Tenant", f"{job.tenant}  (submitted by {job.submitter or 'the system'})"),
        ("State", state),
    ]
    if job.pending_reason:
        lines.append(("Waiting", job.pending_reason))
    if job.is_pending and job.estimated_start_at is not None:
        expected = job.estimated_start_at
        lines.append(("Expected start", f"{local_time(expected)} ({relative_text(expected, now)})"))
    memory = f", {job.memory_mib_per_replica} MiB device memory" if job.memory_mib_per_replica else ""
    lines += [
        ("Resources", f"{gpus_text(job)} card(s) of {_flavors_text(job)}{memory}"),
        ("Priority", f"{job.priority_class} ({job.kind}{', preemptible' if job.preemptible else ''})"),
        ("Command", command_text(job.command)),
        ("Submitted", local_time(job.submitted_at)),
    ]
    if job.started_at:
        lines.append(("Started", f"{local_time(job.started_at)}, ran {duration_text(job.elapsed_s(now))}"))
    if job.finished_at:
        lines.append(("Finished", local_time(job.finished_at)))
    if job.exit_code is not None:
        lines.append(("Exit code", str(job.exit_code)))
    if job.preemption_count:
        lines.append(("Preempted", f"{job.preemption_count} time(s)"))
    if job.array_id:
        lines.append(("Array", f"{job.array_id} index {job.array_index}"))
    for label, value in lines:
        facts.add_row(label, value)
    parts: list[Any] = [facts]
    if job.allocations:
        allocations = Table("REPLICA", "NODE", "DEVICE", "FLAVOR", "CARDS", "MEMORY", "SINCE", box=box.SIMPLE_HEAD)
        for a in job.allocations:
            since = local_time(a.started_at) + (f" → {local_time(a.ended_at)}" if a.ended_at else "")
            cards = f"{a.millis / MILLIS_PER_CARD:g}" + (" (borrowed)" if a.borrowed_millis else "")
            allocations.add_row(str(a.replica), a.node, a.device, a.flavor, cards, f"{a.memory_mib} MiB", since)
        parts += [Text("\nAllocations", style="bold"), allocations]
    endpoints = job.raw.get("endpoints") or []
    if endpoints:
        table = Table("ENDPOINT", "URL", "SERVING REPLICAS", box=box.SIMPLE_HEAD)
        for endpoint in endpoints:
            url = endpoint.get("url") or "(no proxy: call a replica directly)"
            table.add_row(endpoint["name"], url, ", ".join(endpoint.get("replicas") or []) or "none ready")
        parts += [Text("\nEndpoints", style="bold"), table]
    ports = job.raw.get("ports") or []
    if ports:
        table = Table("REPLICA", "ADDRESS", "PORT", "FOR", box=box.SIMPLE_HEAD)
        for port in ports:
            purpose = port.get("name") or {"rendezvous": "MASTER_PORT", "replica": "GPUPOOL_PORT"}.get(
                port["purpose"], port["purpose"]
            )
            table.add_row(str(port["replica"]), port["address"], str(port["port"]), purpose)
        parts += [Text("\nPorts", style="bold"), table]
    if job.events:
        events = Table("TIME", "FROM", "TO", "REASON", "BY", "MESSAGE", box=box.SIMPLE_HEAD)
        for e in job.events:
            events.add_row(local_time(e.created_at), e.from_state, e.to_state, e.reason, e.actor or "", e.message)
        parts += [Text("\nHistory", style="bold"), events]
    console().print(Group(*parts))


@cli.command()
@click.argument("job_id", type=int)
@click.option("--download", "directory", metavar="DIR", help="Save every replica's output (.tar.gz) into DIR.")
@json_option
@api_command
def outputs(job_id: int, directory: str | None, as_json: bool) -> None:
    """A job's outputs: what each replica left in its output_dir, collected when it ended."""
    client = current_state().client()
    rows = client.outputs(job_id)
    if as_json:
        print_json(rows)
        return
    if not rows:
        click.echo(f"Job {job_id} has no outputs (yet): it names no output_dir, or has not ended.")
        return
    if directory:
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        for row in rows:
            target = folder / f"job-{job_id}-replica-{row['replica']}-output.tar.gz"
            client.download_output(job_id, row["replica"], target)
            click.echo(f"{target}  ({row['size_bytes']} bytes, sha256 {row['sha256'][:16]}…)")
        return
    table = Table("REPLICA", "SIZE", "SHA256", "COLLECTED", box=box.SIMPLE_HEAD)
    for row in rows:
        table.add_row(str(row["replica"]), f"{row['size_bytes']} B", row["sha256"][:16] + "…", row["created_at"])
    console().print(table)


@cli.command()
@click.argument("job_id", type=int)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output until the job's output ends.")
@click.option("--replica", type=click.IntRange(0), default=0, show_default=True, help="Which replica's output.")
@click.option("--interval", type=click.FloatRange(0.1), default=1.0, show_default=True, help="Seconds between polls.")
@api_command
def logs(job_id: int, follow: bool, replica: int, interval: float) -> None:
    """Print a job's output (stdout and stderr of one replica); -f follows it while the job runs."""
    client = current_state().client()
    client.job(job_id)  # a missing job is "no job N", not a missing logs endpoint
    try:
        for chunk in client.follow_logs(job_id, replica=replica, follow=follow, poll_s=interval):
            if chunk.truncated_before and chunk.truncated_before > chunk.offset:
                click.echo(f"[the first {chunk.truncated_before} bytes of output are no longer kept]", err=True)
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
    except NotFoundError as exc:
        if "endpoint" in exc.detail:
            raise NotFoundError(
                status=404,
                code="logs_unavailable",
                detail=f"{client.url} does not serve job output (GET /api/v1/jobs/{job_id}/logs/); upgrade it.",
            ) from None
        raise


@cli.command()
@click.argument("job_ids", nargs=-1, type=int)
@click.option("--array", "array_ids", multiple=True, metavar="ARRAY_ID", help="Cancel an array's unfinished tasks.")
@click.option("--indices", default=None, metavar="3-7,9", help="With --array: only these tasks.")
@click.option("--reason", default="", help="Why (kept in the job's history and the audit trail).")
@json_option
@api_command
def cancel(job_ids: Sequence[int], array_ids: Sequence[str], indices: str | None, reason: str, as_json: bool) -> None:
    """Cancel jobs (several ids), or every unfinished job of an array.

    Goes on past a job it cannot cancel and ends with that error's exit code."""
    if not job_ids and not array_ids:
        raise click.UsageError("name the jobs to cancel (ids), or an array with --array ARRAY_ID.")
    client = current_state().client()
    exit_code = EXIT_OK
    results: list[dict[str, Any]] = []
    targets: list[tuple[str, Any]] = [("job", job_id) for job_id in job_ids] + [("array", a) for a in array_ids]
    for kind, target in targets:
        try:
            if kind == "job":
                job = client.cancel(target, reason=reason)
                results.append(job.raw)
                if not as_json:
                    click.echo(f"Cancelled job {job.id} ({job.name}).")
            else:
                done = client.cancel_array(target, reason=reason, indices=indices)
                results.append(done.raw)
                if not as_json:
                    click.echo(
                        f"Cancelled {done.cancelled} task(s) of array {done.array_id}"
                        f" ({done.already_finished} had already ended)."
                    )
        except ApiError as exc:
            exit_code = exit_code or exc.exit_code
            results.append({"target": f"{kind} {target}", **exc.as_dict()})
            if not as_json:
                print_error(ApiError(status=exc.status, code=exc.code, detail=f"{kind} {target}: {exc.detail}"))
    if as_json:
        print_json(results)
    if exit_code:
        raise click.exceptions.Exit(exit_code)
