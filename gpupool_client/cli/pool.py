"""The pool commands: ``quota``, ``nodes``, ``top`` and, for administrators, ``whatif``."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import click
from rich import box
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from gpupool_client.cli.app import api_command, cli, current_state, json_option, print_json
from gpupool_client.cli.jobs import MAX_DETAIL_LOOKUPS
from gpupool_client.cli.output import cards_text, console, relative_text, share_bar
from gpupool_client.client import Client
from gpupool_client.errors import NotFoundError
from gpupool_client.models import ACTIVE_STATES, MILLIS_PER_CARD, Job, QuotaUsage, Tenant


@cli.command()
@click.option("--tenant", "tenant_slugs", multiple=True, metavar="SLUG", help="This tenant (default: yours).")
@json_option
@api_command
def quota(tenant_slugs: Sequence[str], as_json: bool) -> None:
    """Your tenants' quotas per flavor: guarantee, in use, borrowed, lent, limit (in cards)."""
    client = current_state().client()
    tenants = _quota_tenants(client, tenant_slugs)
    rows: list[QuotaUsage] = []
    for tenant in tenants:
        rows += client.quota_usage(tenant.id, tenant_slug=tenant.slug)
    if as_json:
        print_json([row.raw for row in rows])
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
            cards_text(row.guaranteed),
            cards_text(row.in_use),
            cards_text(row.borrowed),
            cards_text(row.lent),
            cards_text(row.available_to_borrow),
            "no limit" if row.limit is None else cards_text(row.limit),
            jobs,
        )
    console().print(table)


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
    rows = current_state().client().nodes(status=status).all()
    if as_json:
        print_json([node.raw for node in rows])
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
            relative_text(node.last_heartbeat_at, now) if node.last_heartbeat_at else "never",
        )
    console().print(table)


@cli.command()
@click.option("--node", help="Only this node's cards.")
@click.option("--flavor", help="Only cards of this flavor.")
@click.option("--interval", type=click.FloatRange(0.5), default=2.0, show_default=True, help="Seconds per refresh.")
@click.option("--once", is_flag=True, help="Print one view and exit (also when output is not a terminal).")
@api_command
def top(node: str | None, flavor: str | None, interval: float, once: bool) -> None:
    """A live view of the cards: utilisation and memory in use (from the nodes' telemetry), how much of each is
    allocated, and whose jobs hold it."""
    client = current_state().client()
    if once or not sys.stdout.isatty():
        console().print(_cards_view(client, node=node, flavor=flavor))
        return
    try:
        with Live(_cards_view(client, node=node, flavor=flavor), console=console(), screen=False) as live:
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
    for column in ("NODE", "GPU", "FLAVOR", "HEALTH", "UTIL", "MEM USED", "ALLOCATED", "DEVICE MEMORY", "JOBS"):
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
            "-" if device.utilization_pct is None else f"{device.utilization_pct:.0f}%",
            "-" if device.memory_used_mib is None else f"{device.memory_used_mib / 1024:.1f} GiB",
            share_bar(millis / MILLIS_PER_CARD),
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
    answer = current_state().client().whatif(changes, days=days)
    if as_json:
        print_json(answer)
        return
    click.echo(f"{answer.get('jobs')} jobs on {answer.get('gpus')} cards, the last {days:g} days, replayed twice:")
    table = Table("METRIC", "CURRENT", "PROPOSED", "CHANGE", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for row in answer.get("metrics", []):
        better = row.get("better")
        style = "green" if better else ("red" if better is False else "")
        table.add_row(
            str(row.get("label", row.get("key"))),
            figure_text(row.get("unit", ""), row.get("current")),
            figure_text(row.get("unit", ""), row.get("proposed")),
            Text(figure_text(row.get("unit", ""), row.get("change")), style=style),
        )
    console().print(table)


def figure_text(unit: str, value: Any) -> str:
    if not isinstance(value, int | float):
        return "-"
    if unit == "share":
        return f"{value:.1%}"
    if unit == "s":
        return f"{value:,.0f} s"
    return f"{value:,.1f}" if isinstance(value, float) else f"{value:,}"
