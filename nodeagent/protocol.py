"""The wire protocol between ``gpupool-agent`` and the portal (version 1).

This is the only module of ``nodeagent`` that the portal imports, so it uses the standard library only.
Every frame is a JSON object ``{"v": 1, "type": "<type>", "id": "<message id>", ...fields}``.
:func:`encode` turns a message dataclass into text, :func:`decode` turns text back into a message and raises
:class:`ProtocolError` (with a stable ``code``) for anything malformed, unknown or badly typed.

Conventions:

* Timestamps (``sent_at``, ``sampled_at``, ``last_checkpoint_at``) are ISO 8601 strings with a UTC offset,
  written by :func:`format_time` and read by :func:`parse_time`.
* A telemetry value a device cannot report (e.g. NVML ``NotSupported``) is ``null``, never a made-up 0.
* Unknown extra fields are ignored, so a newer peer may add optional fields without a version bump;
  anything that changes the meaning of an existing field bumps :data:`PROTOCOL_VERSION`.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal, Union

PROTOCOL_VERSION = 1
#: Largest frame either side accepts or sends, in bytes of UTF-8.
MAX_FRAME_BYTES = 1024 * 1024


class ErrorCode:
    """Stable codes carried by :class:`ProtocolError` and by ``error`` frames."""

    MALFORMED = "malformed"
    UNKNOWN_TYPE = "unknown_type"
    UNSUPPORTED_VERSION = "unsupported_version"
    INVALID_FIELD = "invalid_field"
    TOO_LARGE = "too_large"

    ALL: ClassVar[frozenset[str]] = frozenset({MALFORMED, UNKNOWN_TYPE, UNSUPPORTED_VERSION, INVALID_FIELD, TOO_LARGE})


class ProtocolError(ValueError):
    """A frame that cannot be accepted. ``code`` is one of :class:`ErrorCode`; ``detail`` says what to fix."""

    def __init__(self, code: str, detail: str) -> None:
        if code not in ErrorCode.ALL:
            raise ValueError(f"unknown protocol error code {code!r}")
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


WorkloadState = Literal["starting", "running", "checkpointed", "succeeded", "failed", "stopped", "lost"]
WORKLOAD_STATES: frozenset[str] = frozenset(typing.get_args(WorkloadState))
#: States after which a workload no longer runs on the node.
WORKLOAD_FINAL_STATES: frozenset[str] = frozenset({"succeeded", "failed", "stopped", "lost"})
DeviceHealth = Literal["healthy", "degraded", "unhealthy"]
Vendor = Literal["nvidia", "ascend", "amd", "hygon", "cambricon", "simulated"]

_TIMESTAMP = {"timestamp": True}


def new_message_id() -> str:
    return uuid.uuid4().hex


def format_time(moment: datetime) -> str:
    """An aware datetime as the protocol's ISO 8601 UTC string."""
    if moment.tzinfo is None:
        raise ValueError("protocol timestamps must be timezone-aware")
    return moment.astimezone(UTC).isoformat()


def parse_time(text: str) -> datetime:
    """Parse a protocol timestamp; raises ``ProtocolError(invalid_field)`` for naive or unparsable text."""
    try:
        moment = datetime.fromisoformat(text)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(ErrorCode.INVALID_FIELD, f"{text!r} is not an ISO 8601 timestamp") from exc
    if moment.tzinfo is None:
        raise ProtocolError(ErrorCode.INVALID_FIELD, f"timestamp {text!r} needs a UTC offset, e.g. +00:00")
    return moment


def utc_now_text() -> str:
    return format_time(datetime.now(UTC))


# --- nested records ---------------------------------------------------------------------------------------


@dataclass
class Topology:
    """How the node's devices are wired: ids of NUMA nodes, PCIe switches and NVLink (or HCCS/xGMI) domains."""

    numa_nodes: list[int] = field(default_factory=list)
    pcie_switches: list[str] = field(default_factory=list)
    nvlink_domains: list[str] = field(default_factory=list)


@dataclass
class DeviceInfo:
    index: int
    uuid: str
    vendor: Vendor
    model: str
    memory_mib: int
    numa_node: int | None = None
    pci_bus_id: str | None = None
    mig_mode: bool | None = None
    health: DeviceHealth = "healthy"
    nvlink_domain: str | None = None
    pcie_switch: str | None = None


@dataclass
class RunningWorkload:
    """A workload the agent knows about when it says hello (re-adopted after a restart, or just finished)."""

    job_id: int
    replica: int
    pid: int | None
    state: WorkloadState


@dataclass
class ProcessSample:
    pid: int
    used_memory_mib: int | None = None


@dataclass
class DeviceSample:
    uuid: str
    utilization_pct: float | None = None
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    sm_clock_mhz: int | None = None
    #: Uncorrected ECC errors (volatile: since the driver loaded); null when not supported.
    ecc_errors: int | None = None
    #: Uncorrected ECC errors over the device's lifetime (aggregate); null when not supported.
    ecc_errors_aggregate: int | None = None
    #: Critical (non-application) XID events seen since the agent started; null when not observable.
    xid_errors: int | None = None
    #: The most recent critical XID code, if any.
    last_xid: int | None = None
    processes: list[ProcessSample] = field(default_factory=list)
    health: DeviceHealth | None = None


@dataclass
class DeviceAssignment:
    """One device given to a workload: ``millis`` of 1000 is the whole device."""

    uuid: str
    millis: int
    memory_mib: int | None = None


# --- messages ---------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class Message:
    """Base of every frame. ``type`` is the wire name; ``id`` identifies this frame (not a portal command)."""

    type: ClassVar[str] = ""
    id: str = field(default_factory=new_message_id)


# Agent → portal


@dataclass(kw_only=True)
class Hello(Message):
    type: ClassVar[str] = "hello"
    node_name: str
    agent_version: str
    hostname: str
    cpu_cores: int
    memory_mib: int
    labels: dict[str, str] = field(default_factory=dict)
    topology: Topology = field(default_factory=Topology)
    devices: list[DeviceInfo] = field(default_factory=list)
    workloads: list[RunningWorkload] = field(default_factory=list)


@dataclass(kw_only=True)
class Heartbeat(Message):
    type: ClassVar[str] = "heartbeat"
    seq: int
    sent_at: str = field(default_factory=utc_now_text, metadata=_TIMESTAMP)


@dataclass(kw_only=True)
class Telemetry(Message):
    type: ClassVar[str] = "telemetry"
    sent_at: str = field(default_factory=utc_now_text, metadata=_TIMESTAMP)
    samples: list[DeviceSample] = field(default_factory=list)
    #: When the samples were taken; differs from ``sent_at`` for batches buffered while disconnected.
    sampled_at: str | None = field(default=None, metadata=_TIMESTAMP)
    buffered: bool = False


@dataclass(kw_only=True)
class WorkloadStatus(Message):
    type: ClassVar[str] = "workload.status"
    job_id: int
    replica: int
    state: WorkloadState
    exit_code: int | None = None
    last_checkpoint_at: str | None = field(default=None, metadata=_TIMESTAMP)
    message: str = ""
    log_tail: str = ""


@dataclass(kw_only=True)
class Ack(Message):
    type: ClassVar[str] = "ack"
    command_id: int
    ok: bool = True
    error: str = ""


# Portal → agent


@dataclass(kw_only=True)
class WorkloadStart(Message):
    type: ClassVar[str] = "workload.start"
    command_id: int
    job_id: int
    replica: int
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    working_dir: str | None = None
    devices: list[DeviceAssignment] = field(default_factory=list)
    checkpoint_dir: str | None = None
    max_runtime_s: int | None = None


@dataclass(kw_only=True)
class WorkloadStop(Message):
    type: ClassVar[str] = "workload.stop"
    command_id: int
    job_id: int
    replica: int
    grace_s: float = 30.0
    reason: str = "cancelled"


@dataclass(kw_only=True)
class Config(Message):
    type: ClassVar[str] = "config"
    telemetry_interval_s: float = 1.0
    heartbeat_interval_s: float = 10.0
    process_sample_interval_s: float = 5.0
    command_id: int | None = None


@dataclass(kw_only=True)
class Error(Message):
    type: ClassVar[str] = "error"
    code: str
    detail: str = ""
    #: The ``id`` of the frame this error answers, when it could be read.
    ref_id: str | None = None


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.type: cls
    for cls in (Hello, Heartbeat, Telemetry, WorkloadStatus, Ack, WorkloadStart, WorkloadStop, Config, Error)
}
AGENT_TO_PORTAL: frozenset[str] = frozenset({"hello", "heartbeat", "telemetry", "workload.status", "ack"})
PORTAL_TO_AGENT: frozenset[str] = frozenset({"workload.start", "workload.stop", "config", "error"})


# --- encoding ---------------------------------------------------------------------------------------------


def to_dict(message: Message) -> dict[str, Any]:
    """The frame as a JSON-ready dict (what the portal stores in ``AgentCommand.payload``)."""
    if not isinstance(message, Message) or message.type not in MESSAGE_TYPES:
        raise TypeError(f"{message!r} is not a protocol message")
    body = dataclasses.asdict(message)
    return {"v": PROTOCOL_VERSION, "type": message.type, "id": body.pop("id"), **body}


def encode(message: Message) -> str:
    """The frame as compact JSON text; raises ``ProtocolError(too_large)`` past :data:`MAX_FRAME_BYTES`."""
    text = json.dumps(to_dict(message), separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    size = len(text.encode("utf-8"))
    if size > MAX_FRAME_BYTES:
        raise ProtocolError(
            ErrorCode.TOO_LARGE, f"{message.type} frame is {size} bytes, over {MAX_FRAME_BYTES}; send it in parts"
        )
    return text


def decode(text: str | bytes) -> Message:
    """Parse and validate one frame. Raises :class:`ProtocolError` for anything that is not a valid v1 frame."""
    size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8"))
    if size > MAX_FRAME_BYTES:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"frame is {size} bytes, over the limit of {MAX_FRAME_BYTES}")
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(ErrorCode.MALFORMED, f"frame is not valid JSON: {exc}") from exc
    return from_dict(data)


def from_dict(data: Any) -> Message:
    """Validate a decoded JSON object (or a stored payload dict) and build its message."""
    if not isinstance(data, dict):
        raise ProtocolError(ErrorCode.MALFORMED, "a frame must be a JSON object")
    if "v" not in data:
        raise ProtocolError(ErrorCode.MALFORMED, 'frame has no "v" (protocol version) field')
    version = data["v"]
    if version != PROTOCOL_VERSION or isinstance(version, bool):
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_VERSION,
            f"protocol version {version!r} is not supported; this side speaks v{PROTOCOL_VERSION}",
        )
    kind = data.get("type")
    if not isinstance(kind, str):
        raise ProtocolError(ErrorCode.MALFORMED, 'frame has no string "type" field')
    cls = MESSAGE_TYPES.get(kind)
    if cls is None:
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown frame type {kind!r}; known: {sorted(MESSAGE_TYPES)}")
    message_id = data.get("id")
    if not isinstance(message_id, str) or not message_id:
        raise ProtocolError(ErrorCode.MALFORMED, 'frame has no non-empty string "id" field')
    body = {key: value for key, value in data.items() if key not in ("v", "type")}
    return _build(cls, body, kind)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not allowed in a frame")


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _build(cls: type, data: dict[str, Any], path: str) -> Any:
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for spec in dataclasses.fields(cls):
        where = f"{path}.{spec.name}"
        if spec.name not in data:
            if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
                raise ProtocolError(ErrorCode.INVALID_FIELD, f"{where} is required")
            continue
        value = _check(hints[spec.name], data[spec.name], where)
        if spec.metadata.get("timestamp") and value is not None:
            try:
                parse_time(value)
            except ProtocolError as exc:
                raise ProtocolError(ErrorCode.INVALID_FIELD, f"{where}: {exc.detail}") from None
        kwargs[spec.name] = value
    return cls(**kwargs)


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _check(hint: Any, value: Any, where: str) -> Any:
    """Return ``value`` converted to ``hint`` (nested dataclasses built), or raise invalid_field."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None:
            if type(None) in options:
                return None
            raise ProtocolError(ErrorCode.INVALID_FIELD, f"{where} must not be null")
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _check(option, value, where)
            except ProtocolError as exc:
                errors.append(exc.detail)
        raise ProtocolError(ErrorCode.INVALID_FIELD, errors[0] if len(errors) == 1 else f"{where} has a bad type")
    if origin is Literal:
        allowed = typing.get_args(hint)
        if value not in allowed or isinstance(value, bool):
            raise ProtocolError(ErrorCode.INVALID_FIELD, f"{where} is {value!r}; expected one of {list(allowed)}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ProtocolError(ErrorCode.INVALID_FIELD, f"{where} must be a list, not {type(value).__name__}")
        (item,) = typing.get_args(hint)
        return [_check(item, element, f"{where}[{i}]") for i, element in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ProtocolError(ErrorCode.INVALID_FIELD, f"{where} must be an object, not {type(value).__name__}")
        _key, item = typing.get_args(hint)
        return {key: _check(item, element, f"{where}.{key}") for key, element in value.items()}
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ProtocolError(ErrorCode.INVALID_FIELD, f"{where} must be an object, not {type(value).__name__}")
        return _build(hint, value, where)
    if value is None:
        raise ProtocolError(ErrorCode.INVALID_FIELD, f"{where} must not be null")
    if hint is bool:
        if not isinstance(value, bool):
            raise ProtocolError(ErrorCode.INVALID_FIELD, f"{where} must be true or false, not {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError(ErrorCode.INVALID_FIELD, f"{where} must be an integer, not {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProtocolError(ErrorCode.INVALID_FIELD, f"{where} must be a number, not {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ProtocolError(ErrorCode.INVALID_FIELD, f"{where} must be a string, not {value!r}")
        return value
    if hint is Any:
        return value
    raise TypeError(f"protocol field {where} has an unsupported type {_type_name(hint)}")
