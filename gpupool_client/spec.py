"""Job specs from command-line options and files: ``--gpus 2``, ``--fraction 0.3 --memory 8Gi``, ``--array 0-99``,
``-f job.yaml``. The server validates the result again; the checks here only give a quicker, local message for
what the command line itself got wrong."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpupool_client.models import MILLIS_PER_CARD

MIB = 1024 * 1024
#: Size suffixes as Kubernetes writes them: binary (Ki, Mi, Gi, Ti) and decimal (K, M, G, T); bare = MiB.
SIZE_UNITS = {
    "ki": 1024,
    "mi": MIB,
    "gi": 1024 * MIB,
    "ti": 1024 * 1024 * MIB,
    "k": 1000,
    "m": 1000**2,
    "g": 1000**3,
    "t": 1000**4,
}
SIZE_PATTERN = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KkMmGgTt]i?)?[Bb]?\s*")
ARRAY_PATTERN = re.compile(r"\s*0\s*-\s*(\d+)\s*")
PRIORITIES = ("critical", "high", "normal", "low", "best_effort")


class SpecError(ValueError):
    """A command-line value that cannot become a job spec; the message says how to write it."""


def parse_size_mib(value: str, *, what: str = "size") -> int:
    """``"8Gi"`` → 8192, ``"512Mi"`` → 512, ``"2G"`` → 1908 (decimal GB, rounded up), ``"4096"`` → 4096 MiB."""
    match = SIZE_PATTERN.fullmatch(str(value))
    if match is None:
        raise SpecError(f"{what}: {value!r} is not a size; write e.g. 8Gi, 512Mi or 4096 (MiB).")
    number, unit = float(match.group(1)), (match.group(2) or "mi").lower()
    size_bytes = number * SIZE_UNITS[unit]
    return max(1, -(-int(size_bytes) // MIB)) if size_bytes else 0


def parse_array(value: str) -> int:
    """``"0-99"`` → 100 jobs (indexes 0..99, Slurm's ``--array`` notation; the server numbers from 0)."""
    match = ARRAY_PATTERN.fullmatch(str(value))
    if match is None:
        raise SpecError(
            f"--array: {value!r} is not a range from 0; write 0-N for N+1 jobs with GPUPOOL_ARRAY_INDEX=0..N "
            "(e.g. --array 0-99)."
        )
    return int(match.group(1)) + 1


def fraction_millis(fraction: float) -> int:
    """``0.3`` → 300 millis: a tenth of a card at least, in hundredths, up to 0.99 (a whole card is --gpus 1)."""
    millis = round(fraction * MILLIS_PER_CARD)
    if not 100 <= millis <= 990 or millis % 10 or abs(fraction * MILLIS_PER_CARD - millis) > 1e-6:
        raise SpecError(
            f"--fraction: {fraction:g} is not a part of a card between 0.1 and 0.99 in hundredths (e.g. 0.3 or 0.47); "
            "for whole cards use --gpus N."
        )
    return millis


def parse_env(pairs: Iterable[str]) -> dict[str, str]:
    """``["EPOCHS=10", "LR=0.1"]`` → ``{"EPOCHS": "10", "LR": "0.1"}``."""
    env: dict[str, str] = {}
    for pair in pairs:
        name, separator, value = pair.partition("=")
        if not separator or not name:
            raise SpecError(f"--env: {pair!r} is not NAME=value (e.g. --env EPOCHS=10).")
        env[name] = value
    return env


def load_spec_file(path: str | Path) -> dict[str, Any]:
    """A job spec from a YAML or JSON file (``-f job.yaml``; ``-`` is not supported: name a file)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"-f: cannot read {file}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text) if file.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise SpecError(f"-f: {file} is not valid {'JSON' if file.suffix == '.json' else 'YAML'}: {exc}") from None
    if not isinstance(data, dict):
        raise SpecError(f"-f: {file} must hold one job spec (a mapping with name, resources, command).")
    return data


def build_spec(
    *,
    base: Mapping[str, Any] | None = None,
    command: Sequence[str] = (),
    name: str | None = None,
    tenant: str | None = None,
    gpus: int | None = None,
    fraction: float | None = None,
    memory: str | None = None,
    flavors: Sequence[str] = (),
    any_flavor: bool | None = None,
    replicas: int | None = None,
    priority: str | None = None,
    cpus: float | None = None,
    mem: str | None = None,
    env: Sequence[str] = (),
    array: str | None = None,
    kind: str | None = None,
    max_runtime_s: int | None = None,
    launcher: str | None = None,
) -> dict[str, Any]:
    """The spec to submit: ``base`` (a file's spec) with every option given on the command line on top.

    ``gpus`` and ``fraction`` replace each other (a file asking for whole cards and ``--fraction 0.3`` asks for
    a fraction); ``memory`` is device memory per replica, ``mem`` host memory; ``env`` adds to the file's."""
    if gpus is not None and fraction is not None:
        raise SpecError("--gpus and --fraction exclude each other: whole cards or a part of one.")
    spec: dict[str, Any] = json.loads(json.dumps(dict(base or {})))  # a deep copy the caller's dict keeps out of
    resources: dict[str, Any] = dict(spec.get("resources") or {})
    if command:
        spec["command"] = list(command)
    if name:
        spec["name"] = name
    elif "name" not in spec and spec.get("command"):
        spec["name"] = _name_from_command(spec["command"])
    if tenant:
        spec["tenant"] = tenant
    if gpus is not None:
        resources.pop("millis", None)
        resources["gpus"] = gpus
    if fraction is not None:
        resources.pop("gpus", None)
        resources["millis"] = fraction_millis(fraction)
    if memory is not None:
        resources["memory_mib"] = parse_size_mib(memory, what="--memory")
    if flavors:
        resources.pop("flavor", None)
        resources["flavors"] = list(flavors)
    if any_flavor:
        resources["any_flavor"] = True
    if cpus is not None:
        resources["cpu_cores"] = cpus
    if mem is not None:
        resources["host_memory_mib"] = parse_size_mib(mem, what="--mem")
    if resources:
        spec["resources"] = resources
    if replicas is not None:
        spec["replicas"] = replicas
    if priority:
        spec["priority_class"] = priority
    if kind:
        spec["kind"] = kind
    if max_runtime_s is not None:
        spec["max_runtime_s"] = max_runtime_s
    if launcher:
        spec["launcher"] = launcher
    if env:
        spec["env"] = {**(spec.get("env") or {}), **parse_env(env)}
    if array is not None:
        spec["array"] = {"count": parse_array(array)}
    missing = [what for what in ("command", "resources") if not spec.get(what)]
    if missing:
        hint = {
            "command": "put the command after --, e.g. gpupool-cli submit --gpus 1 -- python train.py",
            "resources": "ask for cards with --gpus N, or --fraction 0.3 --memory 8Gi",
        }
        raise SpecError("; ".join(hint[what] for what in missing) + " (or give a spec file with -f).")
    return spec


def _name_from_command(command: Sequence[str]) -> str:
    """A job name from its command: the script, if there is one, else the program (``python train.py`` → train)."""
    words = [Path(word).name for word in command if word and not word.startswith("-")]
    scripts = [word for word in words if "." in word]
    chosen = (scripts or words or ["job"])[0]
    stem = chosen.rsplit(".", 1)[0] if "." in chosen else chosen
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", stem)[:64] or "job"


def command_text(command: Sequence[str]) -> str:
    return shlex.join(command)
