"""The policies the simulator compares, as ``scheduler.core`` ``Policy`` settings plus how quotas are used.

The algorithm is the engine's; a baseline is only a different setting of its knobs:

- ``fifo``: one queue in submit order, no quotas, no preemption, no backfill (a blocked head blocks the rest);
- ``static``: each tenant capped at its guarantee (no borrowing), no preemption — a strict static partition;
- ``gpupool``: guarantees with borrowing of idle capacity, fair share, preemption to reclaim, backfill,
  fragmentation-aware (FGD) fractional packing;
- ``gpupool-random`` / ``gpupool-worst``: gpupool with random-fit / worst-fit fractional placement.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from enum import Enum

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


TRUE_WORDS = ("true", "yes", "on", "1")
FALSE_WORDS = ("false", "no", "off", "0")
NONE_WORDS = ("none", "null", "")


def setting_names() -> tuple[str, ...]:
    """The knobs of the engine (``Policy`` fields) that ``--set`` and the what-if accept."""
    return tuple(f.name for f in fields(Policy))


def parse_setting(name: str, text: object) -> object:
    """``text`` as the value of ``Policy.<name>``: a bool from true/false/yes/no/on/off/1/0, a number (finite,
    at least 0), the enum's values, ``none`` where the field may be None. Raises ``ValueError`` saying what is
    accepted."""
    hints = typing.get_type_hints(Policy)
    if name not in hints:
        raise ValueError(f"unknown setting {name!r}; the settings are {', '.join(setting_names())}")
    hint = hints[name]
    options = typing.get_args(hint) or (hint,)
    nullable = type(None) in options
    kind = next(t for t in options if t is not type(None))
    if isinstance(text, bool) or (isinstance(text, int | float) and kind is not bool):
        value: object = text
    else:
        value = str(text).strip()
    if nullable and isinstance(value, str) and value.lower() in NONE_WORDS:
        return None
    if kind is bool:
        word = str(value).lower()
        if isinstance(value, bool):
            return value
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
        raise ValueError(f"{name}: expected true or false, got {text!r}")
    if isinstance(kind, type) and issubclass(kind, Enum):
        try:
            return kind(value)
        except ValueError:
            raise ValueError(f"{name}: expected one of {', '.join(m.value for m in kind)}, got {text!r}") from None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name}: expected a number{' or none' if nullable else ''}, got {text!r}") from None
    if not (math.isfinite(number) and number >= 0):
        raise ValueError(f"{name}: expected a number of at least 0, got {text!r}")
    if kind is int:
        if not number.is_integer():
            raise ValueError(f"{name}: expected a whole number, got {text!r}")
        return int(number)
    return number


def parse_settings(pairs: Iterable[str] | Mapping[str, object]) -> dict[str, object]:
    """``["preemption=false", "grace_period_s=300"]`` (or a mapping of the same) → typed ``Policy`` overrides;
    ``ValueError`` names the bad one and lists the valid names."""
    items: list[tuple[str, object]] = []
    if isinstance(pairs, Mapping):
        items = [(str(k), v) for k, v in pairs.items()]
    else:
        for pair in pairs:
            name, sep, text = str(pair).partition("=")
            if not sep:
                raise ValueError(f"{pair!r}: expected NAME=VALUE with NAME one of {', '.join(setting_names())}")
            items.append((name.strip(), text))
    return {name: parse_setting(name, value) for name, value in items}
