"""``gpupool-cli``: submit, list, watch and cancel jobs on a gpupool server from a terminal.

Every command goes through the SDK (:mod:`gpupool_client.client`); nothing here talks HTTP itself. API errors
are printed as the server's ``code`` and ``detail`` and end the command with a distinct exit code
(:mod:`gpupool_client.errors`): 0 ok, 2 usage, 3 auth, 4 not found, 5 refused, 6 server, 7 network.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import click
from click.shell_completion import get_completion_class
from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from gpupool_client import __version__
from gpupool_client.client import Client
from gpupool_client.config import forget_login, save_login
from gpupool_client.errors import EXIT_OK, ApiError, GpupoolError, NotFoundError
from gpupool_client.models import ACTIVE_STATES, FINAL_STATES, MILLIS_PER_CARD, Job, QuotaUsage, Tenant
from gpupool_client.spec import PRIORITIES, SpecError, build_spec, load_spec_file

PROG = "gpupool-cli"
COMPLETE_VAR = "_GPUPOOL_CLI_COMPLETE"
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
STATE_STYLES = {
    "running": "green",
    "admitted": "green",
    "succeeded": "bold green",
    "queued": "yellow",
    "pending_approval": "yellow",
    "submitted": "yellow",
    "preempting": "magenta",
    "node_lost": "magenta",
    "failed": "bold red",
    "cancelled": "dim",
}

F = TypeVar("F", bound=Callable[..., Any])


def _console(*, stderr: bool = False) -> Console:
    # Piped output (scripts, tests) gets wide, uncoloured tables instead of rich's 80-column default.
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 200
    return Console(file=stream, width=width, soft_wrap=False, highlight=False)


@dataclass
class State:
    """Options of the command group, and the client made from them on first use."""

    url: str | None = None
    token: str | None = None
    timeout_s: float | None = None
    max_retries: int = 4
    _client: Client | None = field(default=None, repr=False)

    def client(self) -> Client:
        if self._client is None:
            self._client = Client.from_config(
                url=self.url, token=self.token, timeout_s=self.timeout_s, max_retries=self.max_retries
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def api_command(function: F) -> F:
    """Turn the SDK's errors into a message on stderr (JSON with ``--json``) and the error's exit code."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except SpecError as exc:
            raise click.UsageError(str(exc)) from None
        except GpupoolError as exc:
            _print_error(exc, as_json=bool(kwargs.get("as_json")))
            raise click.exceptions.Exit(exc.exit_code) from None

    return wrapper  # type: ignore[return-value]


def _print_error(exc: GpupoolError, *, as_json: bool = False) -> None:
    err = _console(stderr=True)
    if as_json:
        body = exc.as_dict() if isinstance(exc, ApiError) else {"code": type(exc).__name__, "detail": str(exc)}
        click.echo(json.dumps(body), err=True)
    elif isinstance(exc, ApiError):
        err.print(Text.assemble(("error", "bold red"), f" [{exc.code}]: {exc.detail}"))
        for name, messages in exc.errors.items():
            text = "; ".join(str(m) for m in messages) if isinstance(messages, list) else str(messages)
            if text not in exc.detail:
                err.print(Text(f"  {name}: {text}"))
    else:
        err.print(Text.assemble(("error", "bold red"), f": {exc}"))


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON (the API's objects) instead of text.")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option("--url", metavar="URL", help="Server URL (default: $GPUPOOL_URL, else the saved login).")
@click.option("--token", metavar="TOKEN", help="API token (default: $GPUPOOL_TOKEN, else the saved login).")
@click.option("--timeout", "timeout_s", type=float, metavar="SECONDS", help="Wait this long for each answer.")
@click.option(
    "--retries",
    "max_retries",
    type=click.IntRange(0, 10),
    default=4,
    show_default=True,
    help="Times to retry a request refused for load (429, 503) or that did not reach the server.",
)
@click.version_option(__version__, prog_name=PROG)
@click.pass_context
def cli(ctx: click.Context, url: str | None, token: str | None, timeout_s: float | None, max_retries: int) -> None:
    """Run and watch jobs on a gpupool GPU pool.

    Start with `gpupool-cli login URL`, then `gpupool-cli submit --gpus 1 -- python train.py`.
    """
    state = State(url=url, token=token, timeout_s=timeout_s, max_retries=max_retries)
    ctx.obj = state
    ctx.call_on_close(state.close)


def _state() -> State:
    return click.get_current_context().find_object(State)


# --- login ---------------------------------------------------------------------------------------------------


@cli.command()
@click.argument("url", required=False)
@click.option("--token", "token_option", metavar="TOKEN", help="The API token; asked for (hidden) when not given.")
@click.option("--token-stdin", is_flag=True, help="Read the token from standard input (for scripts).")
@api_command
def login(url: str | None, token_option: str | None, token_stdin: bool) -> None:
    """Save the server URL and your API token (checked against the server first).

    The file is written readable by you only (0600), in your config directory; GPUPOOL_URL and
    GPUPOOL_TOKEN override it. Create a token in the console (your profile) or with POST /api/v1/tokens/."""
    state = _state()
    url = url or state.url or click.prompt("Server URL (e.g. https://pool.example.com)")
    if token_stdin:
        token = sys.stdin.readline().strip()
    else:
        token = token_option or state.token or click.prompt("API token", hide_input=True)
    if not token:
        raise click.UsageError("an empty token: give --token, --token-stdin or type it when asked.")
    try:
        with Client(url, token, timeout_s=state.timeout_s or 30.0) as client:
            me = client.me()
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    path = save_login(url=url, token=token)
    tenants = ", ".join(sorted({m.tenant_slug for m in me.memberships})) or "no tenant"
    role = f", {me.platform_role}" if me.platform_role and me.platform_role != "none" else ""
    click.echo(f"Signed in to {url.rstrip('/')} as {me.username} ({tenants}{role}). Saved to {path}.")


@cli.command()
def logout() -> None:
    """Forget the saved login (the token itself stays valid until it expires or is revoked)."""
    click.echo("Signed out." if forget_login() else "There was no saved login.")


@cli.command()
@json_option
@api_command
def whoami(as_json: bool) -> None:
    """Who the token belongs to, and your tenants."""
    me = _state().client().me()
    if as_json:
        _print_json(me.raw)
        return
    role = me.platform_role if me.platform_role and me.platform_role != "none" else "no platform role"
    click.echo(f"{me.username} on {_state().client().url} ({role})")
    for membership in me.memberships:
        click.echo(f"  {membership.tenant_slug}: {membership.role}")


# --- submit ---------------------------------------------------------------------------------------------------


@cli.command(context_settings={"allow_interspersed_args": False})
@click.option("-f", "--file", "spec_file", type=click.Path(dir_okay=False), help="A job spec (YAML or JSON).")
@click.option("--name", help="Job name (default: from the command, e.g. train for python train.py).")
@click.option("--tenant", help="Tenant slug (needed when you belong to several).")
@click.option("--gpus", type=click.IntRange(1, 64), help="Whole cards per replica.")
@click.option("--fraction", type=float, help="A part of one card per replica: 0.1 to 0.9 (needs --memory).")
@click.option("--memory", metavar="SIZE", help="Device memory per replica, e.g. 8Gi (with --fraction).")
@click.option("--flavor", "flavors", multiple=True, metavar="FLAVOR", help="Card flavor; repeat for any of several.")
@click.option("--replicas", type=click.IntRange(1, 256), help="Gang size: all replicas start together or none.")
@click.option("--priority", type=click.Choice(PRIORITIES), help="Priority class (default normal).")
@click.option("--cpus", type=click.FloatRange(0, 1024), help="CPU cores per replica.")
@click.option("--mem", metavar="SIZE", help="Host memory per replica, e.g. 64Gi.")
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE", help="Environment variable; repeatable.")
@click.option("--array", metavar="0-N", help="Submit N+1 independent jobs (GPUPOOL_ARRAY_INDEX=0..N).")
@click.option("--kind", type=click.Choice(["training", "inference", "interactive", "batch"]))
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
      gpupool-cli submit --array 0-99 --fraction 0.1 --memory 2Gi -- python sweep.py
      gpupool-cli submit -f job.yaml --priority high
    """
    base = load_spec_file(spec_file) if spec_file else None
    spec = build_spec(base=base, command=command, **options)
    if dry_run:
        _print_json(spec)
        return
    client = _state().client()
    resources = spec["resources"]
    if not resources.get("flavors") and not resources.get("flavor"):
        resources["flavors"] = [_only_flavor(client)]
    result = client.submit(spec, idempotency_key=idempotency_key)
    if as_json:
        body = (result.array or result.job).raw  # type: ignore[union-attr]
        _print_json({**body, "idempotency_key": result.idempotency_key, "replayed": result.replayed})
        return
    if quiet:
        click.echo("\n".join(str(job_id) for job_id in result.job_ids))
        return
    again = " (already submitted with this key: nothing new was created)" if result.replayed else ""
    if result.array is not None:
        array = result.array
        click.echo(
            f"Submitted array {array.array_id}: {array.count} jobs {array.first_job_id}..{array.last_job_id} "
            f"to {array.tenant} ({array.state}){again}."
        )
    else:
        job = result.job
        assert job is not None
        reason = f": {job.pending_reason}" if job.pending_reason else ""
        click.echo(f"Submitted job {job.id} to {job.tenant} ({job.state}){again}{reason}")


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
    client = _state().client()
    if mine:
        submitter = client.me().username
    wanted = list(states) or ([] if all_states or array_id else list(UNFINISHED_STATES))
    pages = client.jobs(
        state=wanted, tenant=tenant, submitter=submitter, name=name, kind=kind, array=array_id, limit=limit
    )
    jobs = pages.all()
    if as_json:
        _print_json([job.raw for job in jobs])
        return
    if not jobs:
        click.echo("No jobs." if all_states or states else "No unfinished jobs (--all shows ended ones).")
        return
    nodes = _nodes_of(client, jobs)
    _console().print(_jobs_table(jobs, nodes, now=datetime.now(UTC)))
    if pages.total is not None and pages.total > len(jobs):
        click.echo(f"{len(jobs)} of {pages.total} jobs shown; --limit {pages.total} shows them all.", err=True)


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
            _clip(job.name, 24),
            job.tenant,
            job.submitter or "",
            Text(job.state, style=STATE_STYLES.get(job.state, "")),
            _clip(reason, 28),
            position,
            _gpus(job),
            _clip(",".join(nodes.get(job.id, ())), 30),
            _duration(job.elapsed_s(now)),
        ]
        if with_estimate:
            row.insert(7, _relative(job.estimated_start_at, now) if job.is_pending else "")
        table.add_row(*row)
    return table


# --- show, logs, cancel -----------------------------------------------------------------------------------------


@cli.command()
@click.argument("job_id", type=int)
@json_option
@api_command
def show(job_id: int, as_json: bool) -> None:
    """One job: its state and why, resources, command, allocations and history."""
    job = _state().client().job(job_id)
    if as_json:
        _print_json(job.raw)
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
        lines.append(("Expected start", f"{_local(job.estimated_start_at)} ({_relative(job.estimated_start_at, now)})"))
    memory = f", {job.memory_mib_per_replica} MiB device memory" if job.memory_mib_per_replica else ""
    lines += [
        ("Resources", f"{_gpus(job)} card(s) of {', '.join(job.flavors)}{memory}"),
        ("Priority", f"{job.priority_class} ({job.kind}{', preemptible' if job.preemptible else ''})"),
        ("Command", " ".join(job.command)),
        ("Submitted", _local(job.submitted_at)),
    ]
    if job.started_at:
        lines.append(("Started", f"{_local(job.started_at)}, ran {_duration(job.elapsed_s(now))}"))
    if job.finished_at:
        lines.append(("Finished", _local(job.finished_at)))
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
            since = _local(a.started_at) + (f" → {_local(a.ended_at)}" if a.ended_at else "")
            cards = f"{a.millis / MILLIS_PER_CARD:g}" + (" (borrowed)" if a.borrowed_millis else "")
            allocations.add_row(str(a.replica), a.node, a.device, a.flavor, cards, f"{a.memory_mib} MiB", since)
        parts += [Text("\nAllocations", style="bold"), allocations]
    if job.events:
        events = Table("TIME", "FROM", "TO", "REASON", "BY", "MESSAGE", box=box.SIMPLE_HEAD)
        for e in job.events:
            events.add_row(_local(e.created_at), e.from_state, e.to_state, e.reason, e.actor or "", e.message)
        parts += [Text("\nHistory", style="bold"), events]
    _console().print(Group(*parts))


@cli.command()
@click.argument("job_id", type=int)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output until the job's output ends.")
@click.option("--replica", type=click.IntRange(0), default=0, show_default=True, help="Which replica's output.")
@click.option("--interval", type=click.FloatRange(0.1), default=1.0, show_default=True, help="Seconds between polls.")
@api_command
def logs(job_id: int, follow: bool, replica: int, interval: float) -> None:
    """Print a job's output (stdout and stderr of one replica); -f follows it while the job runs."""
    client = _state().client()
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
@click.option("--array", "array_ids", multiple=True, metavar="ARRAY_ID", help="Cancel an array's unfinished jobs.")
@click.option("--reason", default="", help="Why (kept in the job's history and the audit trail).")
@json_option
@api_command
def cancel(job_ids: Sequence[int], array_ids: Sequence[str], reason: str, as_json: bool) -> None:
    """Cancel jobs (several ids), or every unfinished job of an array.

    Goes on past a job it cannot cancel and ends with that error's exit code."""
    if not job_ids and not array_ids:
        raise click.UsageError("name the jobs to cancel (ids), or an array with --array ARRAY_ID.")
    client = _state().client()
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
                done = client.cancel_array(target, reason=reason)
                results.append(done.raw)
                if not as_json:
                    click.echo(
                        f"Cancelled {done.cancelled} job(s) of array {done.array_id}"
                        f" ({done.already_finished} had already ended)."
                    )
        except ApiError as exc:
            exit_code = exit_code or exc.exit_code
            results.append({"target": f"{kind} {target}", **exc.as_dict()})
            if not as_json:
                _print_error(ApiError(status=exc.status, code=exc.code, detail=f"{kind} {target}: {exc.detail}"))
    if as_json:
        _print_json(results)
    if exit_code:
        raise click.exceptions.Exit(exit_code)


# --- quota, nodes, top ------------------------------------------------------------------------------------------


@cli.command()
@click.option("--tenant", "tenant_slugs", multiple=True, metavar="SLUG", help="This tenant (default: yours).")
@json_option
@api_command
def quota(tenant_slugs: Sequence[str], as_json: bool) -> None:
    """Your tenants' quotas per flavor: guarantee, in use, borrowed, lent, limit (in cards)."""
    client = _state().client()
    tenants = _quota_tenants(client, tenant_slugs)
    rows: list[QuotaUsage] = []
    for tenant in tenants:
        rows += client.quota_usage(tenant.id, tenant_slug=tenant.slug)
    if as_json:
        _print_json([row.raw for row in rows])
        return
    if not rows:
        names = ", ".join(t.slug for t in tenants) or "none"
        click.echo(f"No quotas and nothing in use (tenants: {names}).")
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for column in ("TENANT", "FLAVOR", "GUARANTEED", "IN USE", "BORROWED", "LENT", "CAN BORROW", "LIMIT", "JOBS"):
        table.add_column(column, no_wrap=True, justify="left" if column in ("TENANT", "FLAVOR") else "right")
    for row in rows:
        jobs = (
            f"{row.running_jobs}/{row.max_running_jobs}" if row.max_running_jobs is not None else str(row.running_jobs)
        )
        table.add_row(
            row.tenant,
            row.flavor,
            _cards(row.guaranteed),
            _cards(row.in_use),
            _cards(row.borrowed),
            _cards(row.lent),
            _cards(row.available_to_borrow),
            "no limit" if row.limit is None else _cards(row.limit),
            jobs,
        )
    _console().print(table)


def _quota_tenants(client: Client, slugs: Sequence[str]) -> list[Tenant]:
    if slugs:
        found: list[Tenant] = []
        for slug in slugs:
            match = client.pages("tenants/", Tenant, {"slug": slug}, limit=1).all()
            if not match:
                raise NotFoundError(status=404, code="not_found", detail=f"No tenant {slug!r} is visible to you.")
            found += match
        return found
    me = client.me()
    if me.memberships:
        seen = {m.tenant: m.tenant_slug for m in me.memberships}
        return [Tenant(id=tenant_id, slug=slug) for tenant_id, slug in seen.items()]
    return client.tenants(limit=100).all()  # platform roles: the tenants they see


@cli.command()
@click.option("--status", type=click.Choice(["ready", "not_ready", "cordoned", "draining"]))
@json_option
@api_command
def nodes(status: str | None, as_json: bool) -> None:
    """The pool's nodes: status, cards, CPU, memory, agent and last heartbeat."""
    rows = _state().client().nodes(status=status).all()
    if as_json:
        _print_json([node.raw for node in rows])
        return
    now = datetime.now(UTC)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for column in ("NAME", "STATUS", "CARDS", "CPUS", "MEMORY", "AGENT", "SANDBOX", "HEARTBEAT"):
        table.add_column(column, no_wrap=True)
    for node in rows:
        status_style = "green" if node.status == "ready" else "yellow"
        table.add_row(
            node.name,
            Text(node.status, style=status_style),
            str(node.device_count),
            str(node.cpu_cores),
            f"{node.memory_mib / 1024:.0f} GiB",
            node.agent_version or "-",
            node.sandbox or "-",
            _relative(node.last_heartbeat_at, now) if node.last_heartbeat_at else "never",
        )
    _console().print(table)


@cli.command()
@click.option("--node", help="Only this node's cards.")
@click.option("--flavor", help="Only cards of this flavor.")
@click.option("--interval", type=click.FloatRange(0.5), default=2.0, show_default=True, help="Seconds per refresh.")
@click.option("--once", is_flag=True, help="Print one view and exit (also when output is not a terminal).")
@api_command
def top(node: str | None, flavor: str | None, interval: float, once: bool) -> None:
    """A live view of the cards: how much of each is allocated, device memory, and whose jobs hold it."""
    client = _state().client()
    if once or not sys.stdout.isatty():
        _console().print(_cards_view(client, node=node, flavor=flavor))
        return
    console = _console()
    try:
        with Live(_cards_view(client, node=node, flavor=flavor), console=console, screen=False) as live:
            while True:
                time.sleep(interval)
                live.update(_cards_view(client, node=node, flavor=flavor))
    except KeyboardInterrupt:
        return


def _cards_view(client: Client, *, node: str | None, flavor: str | None) -> Group:
    """One frame of ``top``: a card per row, with the allocations of the active jobs the caller can see."""
    devices = client.devices(node=node, flavor=flavor, limit=5000).all()
    active = client.jobs(state=sorted(ACTIVE_STATES), limit=MAX_DETAIL_LOOKUPS + 1).all()
    held: dict[str, list[tuple[Job, int, int]]] = {}
    for job in active[:MAX_DETAIL_LOOKUPS]:
        try:
            detail = client.job(job.id)
        except NotFoundError:
            continue
        for allocation in detail.allocations:
            if allocation.ended_at is None:
                held.setdefault(allocation.device, []).append((detail, allocation.millis, allocation.memory_mib))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for column in ("NODE", "GPU", "FLAVOR", "HEALTH", "ALLOCATED", "DEVICE MEMORY", "JOBS"):
        table.add_column(column, no_wrap=True)
    total_millis = 0
    for device in devices:
        holders = held.get(device.uuid or "", [])
        millis = min(MILLIS_PER_CARD, sum(m for _, m, _ in holders))
        memory = sum(mem for _, _, mem in holders)
        total_millis += millis
        table.add_row(
            device.node,
            str(device.index),
            device.flavor or device.model,
            Text(device.health, style="green" if device.health == "healthy" else "red"),
            _bar(millis / MILLIS_PER_CARD),
            f"{memory / 1024:.1f}/{device.memory_mib / 1024:.0f} GiB",
            ", ".join(f"{job.id}:{job.tenant}" for job, _, _ in holders),
        )
    stamp = datetime.now().strftime("%H:%M:%S")
    title = Text(
        f"{client.url}  {len(devices)} cards, {total_millis / MILLIS_PER_CARD:g} allocated to jobs you can see  "
        f"({stamp}, Ctrl-C quits)",
        style="bold",
    )
    parts: list[Any] = [title, table]
    if len(active) > MAX_DETAIL_LOOKUPS:
        parts.append(Text(f"(allocations of the first {MAX_DETAIL_LOOKUPS} active jobs shown)", style="dim"))
    return Group(*parts)


# --- whatif, completion -----------------------------------------------------------------------------------------


@cli.command()
@click.option("--set", "pairs", multiple=True, required=True, metavar="NAME=VALUE", help="A proposed setting.")
@click.option("--days", type=click.FloatRange(0.001), default=30.0, show_default=True, help="Replay the last N days.")
@json_option
@api_command
def whatif(pairs: Sequence[str], days: float, as_json: bool) -> None:
    """System admins: replay recent jobs under the scheduler policy in force and with settings changed.

    \b
      gpupool-cli whatif --set preemption=false --days 7
    """
    changes = {}
    for pair in pairs:
        name, separator, value = pair.partition("=")
        if not separator or not name:
            raise click.UsageError(f"--set: {pair!r} is not NAME=VALUE (e.g. --set preemption=false).")
        changes[name] = value
    answer = _state().client().whatif(changes, days=days)
    if as_json:
        _print_json(answer)
        return
    click.echo(f"{answer.get('jobs')} jobs on {answer.get('gpus')} cards, the last {days:g} days, replayed twice:")
    table = Table("METRIC", "CURRENT", "PROPOSED", "CHANGE", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for row in answer.get("metrics", []):
        better = row.get("better")
        style = "green" if better else ("red" if better is False else "")
        table.add_row(
            str(row.get("label", row.get("key"))),
            _figure(row.get("unit", ""), row.get("current")),
            _figure(row.get("unit", ""), row.get("proposed")),
            Text(_figure(row.get("unit", ""), row.get("change")), style=style),
        )
    _console().print(table)


def _figure(unit: str, value: Any) -> str:
    if not isinstance(value, int | float):
        return "-"
    if unit == "share":
        return f"{value:.1%}"
    if unit == "s":
        return f"{value:,.0f} s"
    return f"{value:,.1f}" if isinstance(value, float) else f"{value:,}"


@cli.command()
@click.argument("shell", type=click.Choice(["bash", "zsh"]))
def completion(shell: str) -> None:
    """Print the shell completion script.

    \b
      bash:  echo 'eval "$(gpupool-cli completion bash)"' >> ~/.bashrc
      zsh:   echo 'eval "$(gpupool-cli completion zsh)"' >> ~/.zshrc
    """
    completion_class = get_completion_class(shell)
    assert completion_class is not None
    click.echo(completion_class(cli, {}, PROG, COMPLETE_VAR).source())


# --- formatting -------------------------------------------------------------------------------------------------


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _gpus(job: Job) -> str:
    per_replica = f"{job.gpus_per_replica:g}"
    return per_replica if job.replicas == 1 else f"{job.replicas}x{per_replica}"


def _cards(millis: int) -> str:
    return f"{millis / MILLIS_PER_CARD:g}"


def _bar(share: float, width: int = 10) -> Text:
    filled = round(share * width)
    bar = Text("█" * filled, style="green" if share < 1 else "yellow")
    bar.append("░" * (width - filled), style="dim")
    bar.append(f" {share * 100:3.0f}%")
    return bar


def _duration(seconds: float | None) -> str:
    """Slurm's elapsed format: ``M:SS``, ``H:MM:SS``, ``D-HH:MM:SS``."""
    if seconds is None:
        return ""
    total = int(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


def _relative(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return ""
    delta = (moment - now).total_seconds()
    amount = abs(delta)
    if amount < 60:
        text = f"{amount:.0f}s"
    elif amount < 3600:
        text = f"{amount / 60:.0f}m"
    elif amount < 86400:
        text = f"{amount / 3600:.1f}h"
    else:
        text = f"{amount / 86400:.1f}d"
    return f"in {text}" if delta > 0 else f"{text} ago"


def _local(moment: datetime | None) -> str:
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S") if moment else ""


def run(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (see the module's docstring)."""
    try:
        code = cli.main(args=list(argv) if argv is not None else None, prog_name=PROG, standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    return code if isinstance(code, int) else EXIT_OK


def main() -> None:
    # The completion hook (``_GPUPOOL_CLI_COMPLETE=bash_source``) runs through click's standalone path.
    if os.environ.get(COMPLETE_VAR):
        cli.main(prog_name=PROG)
        return
    sys.exit(run())
