"""How ``gpupool-cli`` prints: the console (wide, uncoloured when piped) and the formats of its columns."""

from __future__ import annotations

import sys
from datetime import datetime

from rich.console import Console
from rich.text import Text

from gpupool_client.models import MILLIS_PER_CARD, Job

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


def console(*, stderr: bool = False) -> Console:
    """Where the commands print. Every string given to it is printed as it is: job names, commands, reasons
    and node names are user data, and rich would read ``[bold]``, ``x[i]`` as markup and ``:smile:`` as an
    emoji code, dropping or changing them. Markup and emoji codes are off here rather than each string escaped
    at its call site (``rich.markup.escape`` misses emoji codes and doubles a trailing backslash); styles come
    only from ``Text`` objects and column styles."""
    # Piped output (scripts, tests) gets wide, uncoloured tables instead of rich's 80-column default.
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 200
    return Console(file=stream, width=width, soft_wrap=False, highlight=False, markup=False, emoji=False)


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def gpus_text(job: Job) -> str:
    per_replica = f"{job.gpus_per_replica:g}"
    return per_replica if job.replicas == 1 else f"{job.replicas}x{per_replica}"


def cards_text(millis: int) -> str:
    return f"{millis / MILLIS_PER_CARD:g}"


def share_bar(share: float, width: int = 10) -> Text:
    filled = round(share * width)
    bar = Text("█" * filled, style="green" if share < 1 else "yellow")
    bar.append("░" * (width - filled), style="dim")
    bar.append(f" {share * 100:3.0f}%")
    return bar


def duration_text(seconds: float | None) -> str:
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


def relative_text(moment: datetime | None, now: datetime) -> str:
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


def local_time(moment: datetime | None) -> str:
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S") if moment else ""
