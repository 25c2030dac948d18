"""PNG charts of simulation results (matplotlib, the optional ``sim`` extra; imported only when plotting)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .fragmentation import FragmentationCurve
from .metrics import utilisation_series
from .simulator import SimResult


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError("plots need matplotlib: pip install 'gpupool[sim]'") from exc
    return plt


def _smooth(values: Sequence[float], width: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= width:
            acc -= values[i - width]
        out.append(acc / min(i + 1, width))
    return out


def utilisation_over_time(
    results: Sequence[SimResult], path: Path, *, title: str, smooth_hours: int = 6, tail_days: float = 7.0
) -> Path:
    """Share of GPUs held over time, one line per policy (``smooth_hours`` moving average)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(11, 4.5), dpi=110)
    horizon_h = None
    for r in results:
        hours, share = utilisation_series(r)
        limit_h = (r.window_s / 3600.0) + tail_days * 24
        horizon_h = limit_h if horizon_h is None else max(horizon_h, limit_h)
        ax.plot([h / 24 for h in hours], [100 * s for s in _smooth(share, smooth_hours)], label=r.policy, lw=1.3)
    if results:
        ax.axvline(results[0].window_s / 86400, color="grey", ls="--", lw=0.8)
        ax.text(results[0].window_s / 86400, 2, " last arrival", color="grey", fontsize=8)
    if horizon_h:
        ax.set_xlim(0, horizon_h / 24)
    ax.set_ylim(0, 105)
    ax.set_xlabel("simulated days")
    ax.set_ylabel(f"GPUs allocated (%, {smooth_hours} h mean)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def fragmentation_curves(curves: Sequence[FragmentationCurve], path: Path, *, title: str) -> Path:
    """Unallocated GPU share vs arrived load, one line per placement strategy (the FGD paper's chart)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=110)
    for i, c in enumerate(curves):
        color = f"C{i}"
        ax.plot([100 * x for x in c.arrived], [100 * y for y in c.unallocated], color=color, label=c.strategy, lw=1.4)
        if c.unallocated_trace:
            ax.plot(
                [100 * x for x in c.arrived],
                [100 * y for y in c.unallocated_trace],
                color=color,
                ls="--",
                lw=0.9,
                label=f"{c.strategy} (trace request, unrounded)",
            )
    top = max((max(c.arrived) for c in curves if c.arrived), default=1.3)
    ax.plot([0, 100, 100 * top], [100, 0, 0], color="grey", ls=":", lw=1, label="perfect packing")
    ax.set_xlabel("arrived GPU requests (% of cluster GPUs)")
    ax.set_ylabel("GPUs unallocated (%)")
    ax.set_xlim(80, 100 * top)
    ax.set_ylim(0, 22)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
