"""The policies the simulator compares, as ``scheduler.core`` ``Policy`` settings plus how quotas are used.

The algorithm is the engine's; a baseline is only a different setting of its knobs:

- ``fifo``: one queue in submit order, no quotas, no preemption, no backfill (a blocked head blocks the rest);
- ``static``: each tenant capped at its guarantee (no borrowing), no preemption — a strict static partition;
- ``gpupool``: guarantees with borrowing of idle capacity, fair share, preemption to reclaim, backfill,
  fragmentation-aware (FGD) fractional packing;
- ``gpupool-random`` / ``gpupool-worst``: gpupool with random-fit / worst-fit fractional placement.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from scheduler.core.types import FractionalStrategy, Ordering, Policy


@dataclass(frozen=True, slots=True)
class SimPolicy:
    name: str
    policy: Policy
    use_quotas: bool = True  # False: no Quota rows and ``require_quota=False`` (one shared unlimited pool)


GPUPOOL = Policy(
    preemption=True,
    borrowing=True,
    fair_share=True,
    backfill=True,
    ordering=Ordering.PRIORITY_FAIRSHARE,
    fractional_strategy=FractionalStrategy.FRAGMENTATION,
)

POLICIES: dict[str, SimPolicy] = {
    "fifo": SimPolicy(
        "fifo",
        Policy(
            preemption=False,
            borrowing=True,
            fair_share=False,
            backfill=False,
            ordering=Ordering.FIFO,
            require_quota=False,
        ),
        use_quotas=False,
    ),
    "static": SimPolicy("static", replace(GPUPOOL, borrowing=False, preemption=False)),
    "gpupool": SimPolicy("gpupool", GPUPOOL),
    "gpupool-random": SimPolicy("gpupool-random", replace(GPUPOOL, fractional_strategy=FractionalStrategy.RANDOM)),
    "gpupool-worst": SimPolicy("gpupool-worst", replace(GPUPOOL, fractional_strategy=FractionalStrategy.WORST_FIT)),
}

DEFAULT_COMPARISON = ("fifo", "static", "gpupool")


def get(name: str, **overrides: object) -> SimPolicy:
    """A named policy, with ``Policy`` fields overridden (``grace_period_s=30`` …)."""
    try:
        chosen = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None
    if not overrides:
        return chosen
    return replace(chosen, policy=replace(chosen.policy, **overrides))
