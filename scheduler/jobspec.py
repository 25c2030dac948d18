"""Validation of a job spec (the JSON a user submits) into a ``JobSpec`` the services can trust.

A spec looks like this (only ``name``, ``resources`` and ``command`` are required)::

    {
      "name": "resnet50",
      "tenant": "acme-vision",              # slug; may be left out when the submitter is in one tenant only
      "kind": "training",                   # training | inference | interactive | batch
      "priority_class": "normal",           # critical | high | normal | low | best_effort
      "preemptible": true,
      "replicas": 2,                        # gang size: all start together or none does
      "resources": {"flavors": ["nvidia-h100-80g"], "gpus": 4, "cpu_cores": 16, "host_memory_mib": 65536},
      "topology": "nvlink",                 # none | same_node | nvlink | numa
      "node_selector": {"zone": "a"},
      "command": ["python", "train.py"],
      "env": {"EPOCHS": "10"},
      "max_runtime_s": 86400, "checkpoint_dir": "/ckpt/resnet50", "runtime_estimate_s": 7200,
      "array": {"count": 100}               # optional: 100 independent copies, GPUPOOL_ARRAY_INDEX=0..99
    }

``resources`` asks either for whole cards (``"gpus": N`` means N x 1000 millis, exclusive) or for a fraction of
one card (``"millis": 100..990`` in steps of 10, with ``"memory_mib"``). Every error names the field and says
how to fix it; unknown fields are refused so a typo never goes unnoticed.

``env`` keys must be POSIX names (``[A-Za-z_][A-Za-z0-9_]*``) and values strings without NUL bytes: the agent
hands them to ``execve``, which cannot take a ``=`` in a name or a NUL anywhere, and a job that cannot start must
be refused here rather than fail on its node. Names on the denylist (``GPUPOOL_ENV_DENYLIST``, by default
``nodeagent.protocol.DEFAULT_ENV_DENYLIST``: ``LD_*``, ``PATH`` and the other loader and libc variables) are
refused too, and the agent checks them again.

``working_dir`` is relative and stays inside the job's directory, a backslash counting as a separator like ``/``.
``checkpoint_dir`` is relative (inside the job's directory) or absolute under one of the prefixes configured for
the job's tenant in ``GPUPOOL_CHECKPOINT_PREFIXES`` (:func:`check_checkpoint_dir`, called once the tenant is
known).
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from catalog.models import ResourceFlavor
from kernel.api import DomainError
from kernel.messages import Message
from nodeagent.protocol import DEFAULT_ENV_DENYLIST, env_denied
from scheduler import messages as scheduler_messages
from scheduler.core.feasibility import NeverFits
from scheduler.core.types import FRACTION_STEP_MILLIS
from scheduler.models import MILLIS_PER_DEVICE, MIN_FRACTION_MILLIS, JobKind, PriorityClass, TopologyConstraint

#: A command that works on any node as it is (python3 is there, and a job starts in an empty directory of its
#: own): a minute of training-like progress, then exit 0. The console's submit form shows it as the example.
EXAMPLE_COMMAND = (
    'python3 -c \'import time; [print("epoch", e, "of 30", flush=True) or time.sleep(2) for e in range(1, 31)]\''
)
MAX_NAME_LENGTH = 128
MAX_REPLICAS = 256
MAX_GPUS_PER_REPLICA = 64
MAX_FLAVORS = 8
MAX_COMMAND_ARGS = 256
MAX_ARG_LENGTH = 4096
MAX_ENV_VARS = 128
MAX_ENV_KEY_LENGTH = 128
MAX_ENV_VALUE_LENGTH = 4096
MAX_PATH_LENGTH = 1024
MAX_RUNTIME_S = 30 * 24 * 3600
MAX_CPU_CORES = 1024
MAX_HOST_MEMORY_MIB = 16 * 1024 * 1024
MAX_NODE_SELECTOR = 16
#: The most tasks one array holds (Slurm's default MaxArraySize is 1001): tasks are not rows until they may start,
#: so the count costs nothing at submit (scheduler.models.JobArray).
MAX_ARRAY_COUNT = 1_000_000
#: An environment variable name as POSIX shells and ``execve`` accept it.
ENV_NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_IMAGE_LENGTH = 512
#: An OCI image reference: [registry[:port]/]path[:tag][@digest], lower case path components.
IMAGE_PATTERN = re.compile(
    r"[a-z0-9]([a-z0-9._-]*[a-z0-9])?(:[0-9]+)?(/[a-z0-9._-]+)*(:[A-Za-z0-9._-]{1,128})?(@sha256:[0-9a-f]{64})?"
)
#: The node label an agent sets when it can run images (``nodeagent.containers``).
OCI_LABEL = "gpupool.io/oci"

TOP_LEVEL_FIELDS = {
    "name",
    "tenant",
    "kind",
    "priority_class",
    "preemptible",
    "replicas",
    "min_replicas",
    "max_replicas",
    "resources",
    "topology",
    "node_selector",
    "command",
    "env",
    "working_dir",
    "max_runtime_s",
    "checkpoint_dir",
    "runtime_estimate_s",
    "array",
    "image",
    "launcher",
    "ports",
    "output_dir",
}
ARRAY_FIELDS = {"count"}
RESOURCE_FIELDS = {"flavors", "flavor", "any_flavor", "gpus", "millis", "memory_mib", "cpu_cores", "host_memory_mib"}
PRIORITY_NAMES = {choice.name.lower(): choice.value for choice in PriorityClass}


#: ``ports``: named ports each replica serves (``[{"name": "http", "ready_path": "/health"}]``): each gets a port
#: of its node (``GPUPOOL_PORT_<NAME>``, the first also ``PORT``) and an endpoint through the serving proxy.
MAX_NAMED_PORTS = 8
PORT_NAME_PATTERN = re.compile(r"[a-z][a-z0-9-]{0,14}")
PORT_FIELDS = {"name", "ready_path"}
RESERVED_PORT_NAMES = {"replica", "rendezvous"}
MAX_READY_PATH = 256


def _named_ports(value: Any) -> list[dict[str, str]]:
    """``ports`` checked: a list of ``{"name", "ready_path"}``, names unique; errors name the element's field."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise _fail("ports", scheduler_messages.PORTS_MUST_LIST_SUCH_NAME)
    if len(value) > MAX_NAMED_PORTS:
        raise _fail("ports", scheduler_messages.PORTS_MOST_NAMED_PORTS, n=MAX_NAMED_PORTS)
    ports, seen = [], set()
    for index, item in enumerate(value):
        where = f"ports[{index}]"
        if not isinstance(item, dict):
            raise _fail(where, scheduler_messages.MUST_OBJECT_SUCH_NAME_HTTP)
        unknown = sorted(set(item) - PORT_FIELDS)
        if unknown:
            raise _fail(
                f"{where}.{unknown[0]}", scheduler_messages.UNKNOWN_FIELD_PORT, fields=", ".join(sorted(PORT_FIELDS))
            )
        name = item.get("name")
        if not isinstance(name, str) or not PORT_NAME_PATTERN.fullmatch(name) or name in RESERVED_PORT_NAMES:
            raise _fail(f"{where}.name", scheduler_messages.MUST_LOWER_CASE_LETTERS_DIGITS)
        if name in seen:
            raise _fail(f"{where}.name", scheduler_messages.NAMED_TWICE_GIVE_EACH_PORT, value=repr(name))
        seen.add(name)
        ready_path = item.get("ready_path", "/")
        if (
            not isinstance(ready_path, str)
            or not ready_path.startswith("/")
            or len(ready_path) > MAX_READY_PATH
            or any(ch.isspace() or ord(ch) < 32 or ch in '"{}' for ch in ready_path)
        ):
            raise _fail(f"{where}.ready_path", scheduler_messages.MUST_URL_PATH_STARTING_HEALTH)
        ports.append({"name": name, "ready_path": ready_path})
    return ports


#: ``launcher``: "none" runs the command on every replica; "mpi" runs it on replica 0 only (``mpirun …``), and
#: the other replicas serve as the nodes mpirun starts its daemons on (``nodeagent/mpi_launch.py``).
LAUNCHER_NONE, LAUNCHER_MPI = "none", "mpi"
LAUNCHERS = {LAUNCHER_NONE, LAUNCHER_MPI}


class JobSpecError(DomainError):
    code = "invalid_job_spec"


class JobNeverFitsError(JobSpecError):
    """A well-formed job that the registered nodes or the quota tree can never give what it asks (like
    ``sbatch``'s "Requested node configuration is not available"). The answer names the field, the most the
    pool or the tree can ever give, per flavor the job names (``limits``; the first is also ``limit``)."""

    code = "job_never_fits"

    def __init__(self, message: str, *, why: NeverFits) -> None:
        limits = [refusal.as_dict() for refusal in why.refusals]
        super().__init__(message, field=why.field, extra={"limit": limits[0], "limits": limits})
        self.why = why


@dataclass(frozen=True)
class JobSpec:
    name: str
    tenant_slug: str | None
    kind: str
    priority_class: int
    preemptible: bool
    replicas: int
    min_replicas: int | None
    max_replicas: int | None
    flavors: tuple[str, ...]
    millis_per_replica: int
    memory_mib_per_replica: int
    cpu_millicores_per_replica: int
    host_memory_mib_per_replica: int
    topology: str
    node_selector: dict[str, str]
    command: list[str]
    env: dict[str, str]
    working_dir: str
    max_runtime_s: int | None
    checkpoint_dir: str
    runtime_estimate_s: int | None
    normalised: dict[str, Any] = field(default_factory=dict)
    # ``"array": {"count": N}``: submit N independent copies (None: one job). Not part of ``normalised``,
    # which is the spec of each job.
    array_count: int | None = None
    #: An OCI image to run the command in ("" : none); such a job only goes to nodes with a container runtime.
    image: str = ""
    #: The flavors are alternatives, not an order of preference: the scheduler picks the one where the job
    #: borrows, then fragments, the least (``core.ReplicaRequest.any_flavor``).
    any_flavor: bool = False

    @property
    def total_millis(self) -> int:
        return self.replicas * self.millis_per_replica


def _fail(field_name: str, message: str | Message, **params: Any) -> JobSpecError:
    """The refusal of ``field_name``: a catalogue message with its parameters (``scheduler.messages``; the field
    is one of them where the sentence names it), or a sentence the field's name is put in front of."""
    if isinstance(message, Message):
        if "field" in message.placeholders:
            params.setdefault("field", field_name)
        return JobSpecError(message(**params), field=field_name)
    return JobSpecError(f"{field_name}: {message}", field=field_name)


def _int(data: dict, key: str, where: str, *, low: int, high: int, default: int | None = None) -> int | None:
    value = data.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(where, scheduler_messages.MUST_WHOLE_NUMBER_BETWEEN_GOT, low=low, high=high, value=repr(value))
    if not low <= value <= high:
        raise _fail(where, scheduler_messages.MUST_BETWEEN_GOT, low=low, high=high, value=value)
    return value


def _str(data: dict, key: str, where: str, *, max_length: int, default: str = "", required: bool = False) -> str:
    value = data.get(key, default)
    if value is None and not required:
        return default
    if not isinstance(value, str):
        raise _fail(where, scheduler_messages.MUST_STRING_GOT, type=type(value).__name__)
    value = value.strip()
    if required and not value:
        raise _fail(where, scheduler_messages.REQUIRED_MUST_NOT_EMPTY)
    if len(value) > max_length:
        raise _fail(where, scheduler_messages.MUST_MOST_CHARACTERS_GOT, max=max_length, n=len(value))
    return value


def _choice(data: dict, key: str, choices: type, default: str) -> str:
    value = data.get(key, default)
    allowed = [c.value for c in choices]
    if value not in allowed:
        raise _fail(key, scheduler_messages.MUST_ONE_GOT, choices=", ".join(allowed), value=repr(value))
    return value


def _string_map(value: Any, where: str, *, max_items: int, max_key: int, max_value: int) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(where, scheduler_messages.MUST_OBJECT_STRINGS, example='{"KEY": "value"}')
    if len(value) > max_items:
        raise _fail(where, scheduler_messages.MAY_HOLD_MOST_ENTRIES_GOT, max=max_items, n=len(value))
    result = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key or len(key) > max_key:
            raise _fail(where, scheduler_messages.KEYS_MUST_NON_EMPTY_STRINGS, max=max_key)
        if not isinstance(item, str):
            raise _fail(f"{where}.{key}", scheduler_messages.MUST_STRING_GOT_QUOTE_NUMBERS, type=type(item).__name__)
        if len(item) > max_value or "\x00" in item:
            raise _fail(f"{where}.{key}", scheduler_messages.MUST_MOST_CHARACTERS_WITHOUT_NUL, max=max_value)
        result[key] = item
    return result


def _env(value: Any) -> dict[str, str]:
    """The job's environment: POSIX names, string values, no NUL anywhere (what ``execve`` can take)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail("env", scheduler_messages.MUST_OBJECT_STRINGS, example='{"EPOCHS": "10"}')
    if len(value) > MAX_ENV_VARS:
        raise _fail("env", scheduler_messages.ENV_MAY_HOLD_MOST_VARIABLES, max=MAX_ENV_VARS, n=len(value))
    for key, item in value.items():
        if not isinstance(key, str) or not ENV_NAME_PATTERN.fullmatch(key):
            shown = repr(key)[1:-1]  # a NUL shows as \x00
            if isinstance(key, str) and "=" in key:
                raise _fail("env", scheduler_messages.ENV_VARIABLE_CONTAINS_NAMES_LETTERS, key=shown)
            if isinstance(key, str) and "\x00" in key:
                raise _fail("env", scheduler_messages.ENV_VARIABLE_CONTAINS_NUL_BYTE, key=shown)
            raise _fail("env", scheduler_messages.ENV_VARIABLE_NOT_VALID_NAME, key=shown)
        if len(key) > MAX_ENV_KEY_LENGTH:
            raise _fail(f"env.{key}", scheduler_messages.NAME_MUST_MOST_CHARACTERS, max=MAX_ENV_KEY_LENGTH)
        if not isinstance(item, str):
            raise _fail(f"env.{key}", scheduler_messages.MUST_STRING_GOT_QUOTE_NUMBERS, type=type(item).__name__)
        if "\x00" in item:
            raise _fail(f"env.{key}", scheduler_messages.VALUE_MUST_NOT_CONTAIN_NUL)
        if len(item) > MAX_ENV_VALUE_LENGTH:
            raise _fail(
                f"env.{key}", scheduler_messages.VALUE_MUST_MOST_CHARACTERS_GOT, max=MAX_ENV_VALUE_LENGTH, n=len(item)
            )
    return dict(value)


def _array(value: Any) -> int | None:
    """``"array": {"count": N}`` → N (1..MAX_ARRAY_COUNT); absent → None."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _fail("array", scheduler_messages.ARRAY_MUST_OBJECT_COUNT_ARRAY)
    unknown = sorted(set(value) - ARRAY_FIELDS)
    if unknown:
        raise _fail(
            f"array.{unknown[0]}", scheduler_messages.NOT_KNOWN_FIELD_ALLOWED, allowed=", ".join(sorted(ARRAY_FIELDS))
        )
    if "count" not in value:
        raise _fail("array.count", scheduler_messages.ARRAY_COUNT_REQUIRED_HOW_MANY)
    return _int(value, "count", "array.count", low=1, high=MAX_ARRAY_COUNT)


def env_denylist() -> tuple[str, ...]:
    """The names a job may not set: ``GPUPOOL_ENV_DENYLIST`` if configured, else the agent's default."""
    configured = getattr(settings, "GPUPOOL_ENV_DENYLIST", None)
    return tuple(configured) if configured else DEFAULT_ENV_DENYLIST


def _relative_path(value: str, where: str) -> str:
    """``value`` as a relative POSIX path inside the job's directory; a backslash is a separator too (an agent or
    a shell on another system may treat it as one), so ``..\\..\\x`` is refused like ``../../x``."""
    if "\x00" in value:
        raise _fail(where, scheduler_messages.MUST_NOT_CONTAIN_NUL_BYTE)
    posix = value.replace("\\", "/")
    parts = PurePosixPath(posix).parts
    if posix.startswith("/") or ".." in parts or (parts and ":" in parts[0]):
        raise _fail(where, scheduler_messages.MUST_RELATIVE_PATH_INSIDE_JOBS)
    return str(PurePosixPath(posix)) if parts else ""


def _absolute_path(value: str, where: str) -> str:
    if "\x00" in value or "\\" in value or ".." in PurePosixPath(value).parts:
        raise _fail(where, scheduler_messages.ABSOLUTE_PATH_MUST_PLAIN_NO)
    return posixpath.normpath(value)


def checkpoint_prefixes(tenant_slug: str) -> list[str]:
    """The absolute checkpoint dir prefixes ``tenant_slug`` may use (``GPUPOOL_CHECKPOINT_PREFIXES``: a JSON
    object of tenant slug → list of prefixes, ``"*"`` for every tenant); none configured: relative dirs only."""
    raw = getattr(settings, "GPUPOOL_CHECKPOINT_PREFIXES", None) or {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw or "{}")
        except ValueError as exc:
            raise ImproperlyConfigured(f"GPUPOOL_CHECKPOINT_PREFIXES is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ImproperlyConfigured('GPUPOOL_CHECKPOINT_PREFIXES must be a JSON object, e.g. {"acme": ["/ckpt/acme"]}')
    prefixes = [*raw.get(tenant_slug, []), *raw.get("*", [])]
    return [posixpath.normpath(prefix) for prefix in prefixes if isinstance(prefix, str) and prefix.startswith("/")]


def check_checkpoint_dir(checkpoint_dir: str, *, tenant_slug: str) -> None:
    """Refuse an absolute ``checkpoint_dir`` outside the tenant's configured prefixes (another node's work dir,
    another tenant's storage, the agent's files). A relative one lives in the job's directory and always passes."""
    if not checkpoint_dir.startswith("/"):
        return
    prefixes = checkpoint_prefixes(tenant_slug)
    shared = str(getattr(settings, "GPUPOOL_SHARED_STORAGE", "") or "").rstrip("/")
    if shared and checkpoint_dir.startswith(shared + "/"):
        raise _fail(
            "checkpoint_dir", scheduler_messages.CHECKPOINT_DIR_SHARED_STORAGE_WHERE, value=repr(checkpoint_dir)
        )
    if any(checkpoint_dir == prefix or checkpoint_dir.startswith(prefix.rstrip("/") + "/") for prefix in prefixes):
        return
    allowed = ", ".join(prefixes) if prefixes else "none are configured for it: use a relative path (in the job dir)"
    raise _fail(
        "checkpoint_dir",
        scheduler_messages.CHECKPOINT_DIR_NOT_UNDER_CHECKPOINT_PREFIX,
        path=checkpoint_dir,
        tenant=tenant_slug,
        prefixes=allowed,
    )


def check_flavors(flavors: list[str] | tuple[str, ...], known_flavors: set[str]) -> None:
    """Raise ``JobSpecError`` naming the first flavor of ``flavors`` that is not in ``known_flavors``."""
    missing = [f for f in flavors if f not in known_flavors]
    if missing:
        hint = ", ".join(sorted(known_flavors)) or "none are defined yet"
        raise _fail(
            "resources.flavors",
            scheduler_messages.RESOURCES_FLAVORS_UNKNOWN_FLAVOR_KNOWN_FLAVORS,
            flavor=missing[0],
            known=hint,
        )


def _priority(value: Any) -> int:
    if isinstance(value, str) and value.lower() in PRIORITY_NAMES:
        return PRIORITY_NAMES[value.lower()]
    if isinstance(value, int) and not isinstance(value, bool) and value in PriorityClass.values:
        return value
    raise _fail("priority_class", scheduler_messages.MUST_ONE_GOT, choices=", ".join(PRIORITY_NAMES), value=repr(value))


def _resources(value: Any, *, known_flavors: set[str] | None) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail("resources", scheduler_messages.RESOURCES_REQUIRED_FLAVORS_NVIDIA_H)
    unknown = sorted(set(value) - RESOURCE_FIELDS)
    if unknown:
        raise _fail(
            f"resources.{unknown[0]}",
            scheduler_messages.NOT_KNOWN_FIELD_ALLOWED,
            allowed=", ".join(sorted(RESOURCE_FIELDS)),
        )
    if "flavor" in value and "flavors" in value:
        raise _fail("resources.flavors", scheduler_messages.RESOURCES_FLAVORS_GIVE_EITHER_FLAVOR)
    flavors = value.get("flavors", [value["flavor"]] if "flavor" in value else None)
    if isinstance(flavors, str):
        flavors = [flavors]
    if not isinstance(flavors, list) or not flavors or not all(isinstance(f, str) and f for f in flavors):
        raise _fail("resources.flavors", scheduler_messages.RESOURCES_FLAVORS_MUST_NON_EMPTY)
    if len(flavors) > MAX_FLAVORS:
        raise _fail("resources.flavors", scheduler_messages.RESOURCES_FLAVORS_MAY_NAME_MOST, max=MAX_FLAVORS)
    flavors = list(dict.fromkeys(flavors))
    if known_flavors is not None:
        check_flavors(flavors, known_flavors)
    any_flavor = value.get("any_flavor", False)
    if not isinstance(any_flavor, bool):
        raise _fail("resources.any_flavor", scheduler_messages.RESOURCES_ANY_FLAVOR_MUST_TRUE)

    has_gpus, has_millis = "gpus" in value, "millis" in value
    if has_gpus == has_millis:
        raise _fail("resources", scheduler_messages.RESOURCES_ASK_WHOLE_CARDS_GPUS)
    if has_gpus:
        gpus = _int(value, "gpus", "resources.gpus", low=1, high=MAX_GPUS_PER_REPLICA)
        millis = gpus * MILLIS_PER_DEVICE
        memory_mib = _int(value, "memory_mib", "resources.memory_mib", low=0, high=16 * 1024 * 1024, default=0)
    else:
        millis = _int(
            value, "millis", "resources.millis", low=MIN_FRACTION_MILLIS, high=MILLIS_PER_DEVICE - FRACTION_STEP_MILLIS
        )
        if millis % FRACTION_STEP_MILLIS:
            raise _fail(
                "resources.millis",
                scheduler_messages.RESOURCES_MILLIS_MUST_MULTIPLE_CARD,
                step=FRACTION_STEP_MILLIS,
                value=millis,
            )
        if "memory_mib" not in value:
            raise _fail("resources.memory_mib", scheduler_messages.RESOURCES_MEMORY_MIB_REQUIRED_FRACTIONAL)
        memory_mib = _int(value, "memory_mib", "resources.memory_mib", low=1, high=16 * 1024 * 1024)
    cpu_cores = value.get("cpu_cores", 0)
    if isinstance(cpu_cores, bool) or not isinstance(cpu_cores, int | float) or not 0 <= cpu_cores <= MAX_CPU_CORES:
        raise _fail("resources.cpu_cores", scheduler_messages.RESOURCES_CPU_CORES_MUST_NUMBER, max=MAX_CPU_CORES)
    host_memory_mib = _int(
        value, "host_memory_mib", "resources.host_memory_mib", low=0, high=MAX_HOST_MEMORY_MIB, default=0
    )
    return {
        "flavors": flavors,
        "any_flavor": any_flavor,
        "millis": millis,
        "memory_mib": memory_mib,
        "cpu_millicores": round(cpu_cores * 1000),
        "host_memory_mib": host_memory_mib,
    }


def validate_job_spec(data: Any, *, known_flavors: set[str] | None = None, check_flavor_names: bool = True) -> JobSpec:
    """Check ``data`` and return the normalised spec; raises ``JobSpecError`` naming the first bad field.

    ``known_flavors`` defaults to the flavors in the database; pass a set to validate without it. With
    ``check_flavor_names=False`` the flavor names are left for the caller to check (``check_flavors``): the
    submit service asks the database in the same query that resolves the tenant.
    """
    if not isinstance(data, dict):
        raise JobSpecError(scheduler_messages.JOB_SPEC_MUST_JSON_OBJECT())
    unknown = sorted(set(data) - TOP_LEVEL_FIELDS)
    if unknown:
        raise _fail(unknown[0], scheduler_messages.NOT_KNOWN_FIELD_ALLOWED, allowed=", ".join(sorted(TOP_LEVEL_FIELDS)))
    if known_flavors is None and check_flavor_names:
        known_flavors = set(ResourceFlavor.objects.values_list("name", flat=True))

    name = _str(data, "name", "name", max_length=MAX_NAME_LENGTH, required=True)
    tenant = data.get("tenant")
    if tenant is not None and (not isinstance(tenant, str) or not tenant):
        raise _fail("tenant", scheduler_messages.TENANT_MUST_TENANT_SLUG)
    kind = _choice(data, "kind", JobKind, JobKind.TRAINING)
    priority = _priority(data.get("priority_class", "normal"))
    preemptible = data.get("preemptible", True)
    if not isinstance(preemptible, bool):
        raise _fail("preemptible", scheduler_messages.PREEMPTIBLE_MUST_TRUE_FALSE)
    replicas = _int(data, "replicas", "replicas", low=1, high=MAX_REPLICAS, default=1)
    min_replicas = _int(data, "min_replicas", "min_replicas", low=1, high=MAX_REPLICAS)
    max_replicas = _int(data, "max_replicas", "max_replicas", low=1, high=MAX_REPLICAS)
    if (min_replicas is not None or max_replicas is not None) and kind != JobKind.INFERENCE:
        raise _fail("min_replicas", scheduler_messages.MIN_REPLICAS_MIN_REPLICAS_MAX)
    if min_replicas is not None and min_replicas > replicas:
        raise _fail("min_replicas", scheduler_messages.MIN_REPLICAS_MUST_NOT_EXCEED, n=replicas)
    if max_replicas is not None and max_replicas < replicas:
        raise _fail("max_replicas", scheduler_messages.MAX_REPLICAS_MUST_LEAST_REPLICAS, n=replicas)
    resources = _resources(data.get("resources"), known_flavors=known_flavors)
    topology = _choice(data, "topology", TopologyConstraint, TopologyConstraint.NONE)

    command = data.get("command")
    if not isinstance(command, list) or not command:
        raise _fail("command", scheduler_messages.COMMAND_MUST_NON_EMPTY_LIST)
    if len(command) > MAX_COMMAND_ARGS:
        raise _fail("command", scheduler_messages.COMMAND_MAY_HOLD_MOST_ARGUMENTS, max=MAX_COMMAND_ARGS)
    for position, arg in enumerate(command):
        if not isinstance(arg, str):
            raise _fail(f"command[{position}]", scheduler_messages.MUST_STRING_GOT, type=type(arg).__name__)
        if len(arg) > MAX_ARG_LENGTH or "\x00" in arg:
            raise _fail(f"command[{position}]", scheduler_messages.MUST_MOST_CHARACTERS_WITHOUT_NUL, max=MAX_ARG_LENGTH)
    if not command[0].strip():
        raise _fail("command[0]", scheduler_messages.COMMAND_PROGRAM_RUN_MUST_NOT)

    env = _env(data.get("env"))
    reserved = sorted(k for k in env if k.startswith("GPUPOOL_") or k.startswith("CUDA_"))
    if reserved:
        raise _fail(f"env.{reserved[0]}", scheduler_messages.GPUPOOL_CUDA_SET_PLATFORM_REMOVE)
    denied = env_denied(env, env_denylist())
    if denied is not None:
        raise _fail(
            f"env.{denied}",
            scheduler_messages.MAY_NOT_SET_JOB_STEERS,
            name=denied,
            denied=", ".join(env_denylist()),
        )
    node_selector = _string_map(
        data.get("node_selector"), "node_selector", max_items=MAX_NODE_SELECTOR, max_key=128, max_value=256
    )
    image = _str(data, "image", "image", max_length=MAX_IMAGE_LENGTH)
    if image:
        if not IMAGE_PATTERN.fullmatch(image):
            raise _fail("image", scheduler_messages.IMAGE_MUST_OCI_IMAGE_REFERENCE)
        if node_selector.get(OCI_LABEL, "true") != "true":
            raise _fail("node_selector", scheduler_messages.NODE_SELECTOR_JOB_IMAGE_NEEDS, label=OCI_LABEL)
        # Only nodes whose agent found podman or docker say so in their labels; a job waits with the selector's
        # pending reason where none has one.
        node_selector = {**node_selector, OCI_LABEL: "true"}
    named_ports = _named_ports(data.get("ports"))
    launcher = _str(data, "launcher", "launcher", max_length=16) or LAUNCHER_NONE
    if launcher not in LAUNCHERS:
        raise _fail(
            "launcher",
            scheduler_messages.LAUNCHER_MUST_ONE_NOT,
            choices=", ".join(sorted(LAUNCHERS)),
            value=repr(launcher),
        )
    working_dir = _relative_path(_str(data, "working_dir", "working_dir", max_length=MAX_PATH_LENGTH), "working_dir")
    output_dir = _relative_path(_str(data, "output_dir", "output_dir", max_length=MAX_PATH_LENGTH), "output_dir")
    checkpoint_dir = _str(data, "checkpoint_dir", "checkpoint_dir", max_length=MAX_PATH_LENGTH)
    if checkpoint_dir and not checkpoint_dir.startswith("/"):
        checkpoint_dir = _relative_path(checkpoint_dir, "checkpoint_dir")
    elif checkpoint_dir:
        checkpoint_dir = _absolute_path(checkpoint_dir, "checkpoint_dir")
    max_runtime_s = _int(data, "max_runtime_s", "max_runtime_s", low=1, high=MAX_RUNTIME_S)
    runtime_estimate_s = _int(data, "runtime_estimate_s", "runtime_estimate_s", low=1, high=MAX_RUNTIME_S)
    array_count = _array(data.get("array"))

    normalised = {
        "name": name,
        "tenant": tenant,
        "kind": kind,
        "priority_class": PriorityClass(priority).name.lower(),
        "preemptible": preemptible,
        "replicas": replicas,
        "min_replicas": min_replicas,
        "max_replicas": max_replicas,
        "resources": {
            "flavors": resources["flavors"],
            **({"any_flavor": True} if resources["any_flavor"] else {}),
            **(
                {"gpus": resources["millis"] // MILLIS_PER_DEVICE}
                if resources["millis"] >= MILLIS_PER_DEVICE
                else {"millis": resources["millis"]}
            ),
            "memory_mib": resources["memory_mib"],
            "cpu_cores": resources["cpu_millicores"] / 1000,
            "host_memory_mib": resources["host_memory_mib"],
        },
        "topology": topology,
        "node_selector": node_selector,
        "command": command,
        "env": env,
        "working_dir": working_dir,
        "max_runtime_s": max_runtime_s,
        "checkpoint_dir": checkpoint_dir,
        "runtime_estimate_s": runtime_estimate_s,
        **({"image": image} if image else {}),
        **({"launcher": launcher} if launcher != LAUNCHER_NONE else {}),
        **({"ports": named_ports} if named_ports else {}),
        **({"output_dir": output_dir} if output_dir else {}),
    }
    return JobSpec(
        name=name,
        tenant_slug=tenant,
        kind=kind,
        priority_class=priority,
        preemptible=preemptible,
        replicas=replicas,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        flavors=tuple(resources["flavors"]),
        any_flavor=resources["any_flavor"],
        millis_per_replica=resources["millis"],
        memory_mib_per_replica=resources["memory_mib"],
        cpu_millicores_per_replica=resources["cpu_millicores"],
        host_memory_mib_per_replica=resources["host_memory_mib"],
        topology=topology,
        node_selector=node_selector,
        command=list(command),
        env=env,
        working_dir=working_dir,
        max_runtime_s=max_runtime_s,
        checkpoint_dir=checkpoint_dir,
        runtime_estimate_s=runtime_estimate_s,
        image=image,
        normalised=normalised,
        array_count=array_count,
    )
