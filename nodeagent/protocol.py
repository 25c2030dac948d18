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

import codecs
import dataclasses
import functools
import json
import re
import types
import typing
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal, Union

PROTOCOL_VERSION = 1
#: Largest frame either side accepts or sends, in bytes of UTF-8.
MAX_FRAME_BYTES = 1024 * 1024
#: Deepest nesting of objects and arrays a frame may have (valid frames nest at most 4 levels). Checked before
#: parsing: ``json.loads`` recurses once per level, and a 6 KB frame nested 3,000 deep exhausted the stack. A
#: frame with no more brackets than this (a telemetry frame of 8 cards with 5 processes each) is not scanned.
MAX_FRAME_DEPTH = 64
#: Largest piece of a workload's output one ``workload.log`` frame carries, in bytes of UTF-8.
MAX_LOG_CHUNK_BYTES = 64 * 1024
#: ``reason`` of a ``stopped`` workload that the agent stopped itself because it had lost the portal (fencing).
FENCED = "fenced"
#: Longest fence time, grace or requeue time a ``config`` frame may carry (a day), in seconds.
MAX_FENCE_S = 86400.0


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
#: Environment variables a job may not set, checked by the portal at submit and by the agent before it starts a
#: workload (the portal's ``GPUPOOL_ENV_DENYLIST`` and the agent's ``--env-deny`` may replace it). A name ending in
#: ``*`` is a prefix. They steer the dynamic loader and libc of every process the workload starts (``LD_PRELOAD``
#: would replace HAMi-core's memory and SM limiter), or the search path the platform's tools rely on.
DEFAULT_ENV_DENYLIST: tuple[str, ...] = (
    "LD_*",
    "GCONV_PATH",
    "GETCONF_DIR",
    "GLIBC_TUNABLES",
    "HOSTALIASES",
    "LOCALDOMAIN",
    "LOCPATH",
    "MALLOC_TRACE",
    "NIS_PATH",
    "NLSPATH",
    "RESOLV_HOST_CONF",
    "RES_OPTIONS",
    "TZDIR",
    "PATH",
    "BASH_ENV",
    "ENV",
    "PYTHONSTARTUP",
    "PYTHONINSPECT",
)


def env_denied(names: Iterable[str], denylist: Iterable[str] = DEFAULT_ENV_DENYLIST) -> str | None:
    """The first of ``names`` (sorted) that ``denylist`` forbids, or None."""
    exact = {entry for entry in denylist if not entry.endswith("*")}
    prefixes = tuple(entry[:-1] for entry in denylist if entry.endswith("*"))
    for name in sorted(names):
        if name in exact or (prefixes and name.startswith(prefixes)):
            return name
    return None


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


#: Report ids are stored as a signed 64-bit integer by the portal.
MAX_REPORT_ID = 2**63 - 1


def _check_report_id(value: object, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_REPORT_ID:
        raise ProtocolError(ErrorCode.INVALID_FIELD, f"{where} must be an integer from 1 to {MAX_REPORT_ID}")


#: Byte offsets of a log are stored as a signed 64-bit integer by the portal; replica numbers as a small one.
MAX_LOG_OFFSET = 2**63 - 1
MAX_REPLICA = 32767


_REPLACE_EACH_BYTE = "gpupool-replace-each-byte"


def _replace_each_byte(error: UnicodeError) -> tuple[str, int]:
    if not isinstance(error, UnicodeDecodeError):
        raise error
    return "?" * (error.end - error.start), error.end


codecs.register_error(_REPLACE_EACH_BYTE, _replace_each_byte)


def decode_output(data: bytes) -> str:
    """Output bytes as text of exactly ``len(data)`` bytes of UTF-8, for ``workload.log``: each byte that is not
    part of valid UTF-8, and each NUL (which no database column takes), becomes ``?``, so byte offsets count the
    same on the agent's file and in the portal's text."""
    return data.decode("utf-8", _REPLACE_EACH_BYTE).replace("\0", "?")


def _check_log_position(*, job_id: int, replica: int, offset: int, where: str) -> None:
    if not 0 < job_id <= MAX_REPORT_ID:
        raise ProtocolError(ErrorCode.INVALID_FIELD, f"{where}.job_id must be a positive job id, not {job_id}")
    if not 0 <= replica <= MAX_REPLICA:
        raise ProtocolError(ErrorCode.INVALID_FIELD, f"{where}.replica must be from 0 to {MAX_REPLICA}, not {replica}")
    if not 0 <= offset <= MAX_LOG_OFFSET:
        raise ProtocolError(ErrorCode.INVALID_FIELD, f"{where}.offset must be a byte offset from 0, not {offset}")


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
    """A workload the agent knows about when it says hello: running (re-adopted after a restart) or finished
    with its final report not yet acknowledged by the portal (that report follows the hello from the outbox)."""

    job_id: int
    replica: int
    pid: int | None
    state: WorkloadState
    #: The ``workload.start`` command this run came from (0 when unknown: agents before the outbox).
    command_id: int = 0
    exit_code: int | None = None


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


def parse_port_range(text: str) -> tuple[int, int]:
    """``"first-last"`` (inclusive) as a pair; raises ValueError unless 1024 <= first <= last <= 65535."""
    first, sep, last = str(text).strip().partition("-")
    try:
        low, high = int(first), int(last)
    except ValueError:
        low = high = -1
    if not sep or not 1024 <= low <= high <= 65535:
        raise ValueError(f"{text!r} must be 'first-last' with 1024 <= first <= last <= 65535, e.g. 29500-32767")
    return low, high


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
    #: True when ``workloads`` names every workload the agent knows (running, and finished with an unacked
    #: report), so the portal may requeue a job it believes runs here that the list lacks. Agents before the
    #: durable outbox leave it false: their list has running workloads only, and nothing is requeued for it.
    workloads_complete: bool = False
    #: How the agent confines workloads: ``namespaces`` (own uid, namespaces, cgroups), ``none`` (development:
    #: unconfined), ``unavailable`` (asked for but cannot be made: workloads fail), or ``""`` from agents before
    #: the sandbox. See ``nodeagent.sandbox``.
    sandbox: str = ""
    #: True: answer each heartbeat with a ``heartbeat.ack`` (agents that fence count the portal's answers).
    heartbeat_acks: bool = False
    #: The address other nodes reach this node by (``gpupool-agent run --address``); "" from older agents.
    address: str = ""
    #: The ports this node hands to jobs, "first-last" (``--job-ports``); "": the portal's default range.
    job_ports: str = ""
    #: How the agent keeps tenants' jobs from reaching each other's sockets: ``nftables`` or ``none``
    #: (``nodeagent.netpolicy``); "" from older agents.
    network_isolation: str = ""


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
    #: Why a final state came about, when the agent knows better than the exit code: ``oom_killed`` (the
    #: workload's cgroup hit its host memory limit), ``sandbox_failed`` (its sandbox could not be set up),
    #: ``rejected`` (the start was refused), ``fenced`` (:data:`FENCED`: the agent stopped it itself because
    #: the portal was out of reach). ``""`` otherwise.
    reason: str = ""
    #: The agent's id of this report: per agent, increasing, kept in its durable outbox until the portal
    #: answers ``report.ack`` with it. Null from agents before the outbox (those reports are never acked).
    report_id: int | None = None
    #: The ``workload.start`` command of the run this report is about, so that a late report on an earlier run of
    #: the replica on this node never changes the run placed there since. 0: unknown (agents before it).
    command_id: int = 0

    def __post_init__(self) -> None:
        if self.report_id is not None:
            _check_report_id(self.report_id, "workload.status.report_id")


@dataclass(kw_only=True)
class WorkloadLog(Message):
    """A piece of one workload replica's output: ``text`` is the bytes of the replica's log from byte ``offset``
    on, as UTF-8 (the agent replaces each byte that is not valid UTF-8, and each NUL, with ``?``, so ``text``
    is exactly as many bytes as it covers). At most :data:`MAX_LOG_CHUNK_BYTES`. The portal answers
    ``workload.log.ack``; a piece sent again (same offsets) changes nothing."""

    type: ClassVar[str] = "workload.log"
    job_id: int
    replica: int
    offset: int
    text: str

    def __post_init__(self) -> None:
        _check_log_position(job_id=self.job_id, replica=self.replica, offset=self.offset, where=self.type)
        try:
            size = len(self.text.encode("utf-8"))
        except UnicodeEncodeError:  # a lone surrogate (a JSON "\ud800" escape): no database can store it
            raise ProtocolError(ErrorCode.INVALID_FIELD, "workload.log.text is not valid Unicode") from None
        if not 0 < size <= MAX_LOG_CHUNK_BYTES:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                f"workload.log.text must be 1 to {MAX_LOG_CHUNK_BYTES} bytes of UTF-8, not {size}; send it in parts",
            )

    @property
    def next_offset(self) -> int:
        """The offset right after this piece."""
        return self.offset + len(self.text.encode("utf-8"))


@dataclass(kw_only=True)
class Ack(Message):
    type: ClassVar[str] = "ack"
    command_id: int
    ok: bool = True
    error: str = ""


# Portal → agent


@dataclass(kw_only=True)
class HeartbeatAck(Message):
    """The portal handled heartbeat ``seq`` (sent to agents whose hello asked for ``heartbeat_acks``)."""

    type: ClassVar[str] = "heartbeat.ack"
    seq: int


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
    #: The job's tenant (the sandbox's uid is chosen per tenant), and its per-replica CPU and host memory limits
    #: (null or 0: no limit). Null from portals before the sandbox.
    tenant_id: int | None = None
    cpu_cores: float | None = None
    host_memory_mib: int | None = None
    #: An OCI image to run ``command`` in (podman or docker on the node); null: the node's own file system.
    image: str | None = None
    #: Where this run's output continues the replica's log (``workload.log`` offsets): the bytes earlier runs of
    #: the job (before a preemption or requeue) left there. 0 for a first run, and from portals before live logs.
    log_offset: int = 0
    #: The job's hostfile (``address slots=N`` per node, Open MPI's and DeepSpeed's format): the agent writes it
    #: to the job dir and points ``GPUPOOL_HOSTFILE`` and ``OMPI_MCA_orte_default_hostfile`` at it. "" from
    #: portals before the launch contract.
    hostfile: str = ""
    #: The addresses of every node the job runs on: only these may reach the job's sockets from other nodes
    #: (``nodeagent.netpolicy``).
    peer_addresses: list[str] = field(default_factory=list)
    #: "mpi": replica 0 runs the command with ``nodeagent/mpi_launch.py`` as Open MPI's rsh agent, the other
    #: replicas serve its calls instead of running the command. "" : every replica runs the command.
    launcher: str = ""
    #: The tenant's part of the node's shared storage (``--shared-storage``): the only part the workload sees,
    #: writable; the job's checkpoint dir is inside it. "" : no shared storage.
    shared_dir: str = ""
    #: A dir (relative to the job dir) whose files are collected and uploaded when the replica ends, and the most
    #: bytes they may hold (0: the agent's own limit). "" : nothing collected.
    output_dir: str = ""
    output_max_bytes: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.log_offset <= MAX_LOG_OFFSET:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD, f"workload.start.log_offset must be from 0, not {self.log_offset}"
            )


@dataclass(kw_only=True)
class WorkloadStop(Message):
    type: ClassVar[str] = "workload.stop"
    command_id: int
    job_id: int
    replica: int
    grace_s: float = 30.0
    reason: str = "cancelled"
    #: Seconds the workload keeps running untouched before its SIGTERM (then ``grace_s`` to SIGKILL): a replica the
    #: serving proxy has just dropped still answers the requests the proxy had routed to it before (Kubernetes'
    #: preStop sleep). 0 for a workload without endpoints.
    drain_s: float = 0.0


@dataclass(kw_only=True)
class ReportAck(Message):
    """The portal is done with the agent's report ``report_id``: the agent drops it from its outbox.

    ``ok`` is true when the report was applied or was a duplicate of one already applied (``code``
    ``duplicate``); false, with ``code`` and ``detail``, when the portal refused it for good (it logged why:
    resending would not help). A report the portal could not apply for a passing reason (the database was
    busy) gets an ``error`` frame with code ``retry_later`` instead and no ack, so the agent sends it again.
    """

    type: ClassVar[str] = "report.ack"
    report_id: int
    ok: bool = True
    code: str = ""
    detail: str = ""

    def __post_init__(self) -> None:
        _check_report_id(self.report_id, "report.ack.report_id")


@dataclass(kw_only=True)
class WorkloadLogAck(Message):
    """The portal has the replica's log up to ``next_offset`` (the end of the piece at ``offset``), or refused
    the piece for good (``ok`` false: the node does not hold that replica; ``code`` and ``detail`` say why).
    A piece the portal could not store for a passing reason gets an ``error`` frame ``retry_later`` instead."""

    type: ClassVar[str] = "workload.log.ack"
    job_id: int
    replica: int
    offset: int
    next_offset: int
    ok: bool = True
    code: str = ""
    detail: str = ""

    def __post_init__(self) -> None:
        _check_log_position(job_id=self.job_id, replica=self.replica, offset=self.offset, where=self.type)
        if not self.offset <= self.next_offset <= MAX_LOG_OFFSET:
            raise ProtocolError(ErrorCode.INVALID_FIELD, "workload.log.ack.next_offset must not be before its offset")


@dataclass(kw_only=True)
class Config(Message):
    """The portal's settings for the agent, sent when the socket opens (and on a change).

    The fence fields tell the agent when to fence itself (``nodeagent.fencing``): with no answer from the portal
    for ``fence_after_s`` seconds it stops every workload (SIGTERM, ``fence_grace_s`` seconds to checkpoint, then
    SIGKILL), so they have ended before the portal, ``requeue_after_s`` seconds after the node's last heartbeat
    (lease plus grace), runs their jobs on other nodes. ``fence_after_s`` 0: no fencing; null (portals before
    fencing): the portal says nothing and the agent keeps what it was told before or on its command line.
    """

    type: ClassVar[str] = "config"
    telemetry_interval_s: float = 1.0
    heartbeat_interval_s: float = 10.0
    process_sample_interval_s: float = 5.0
    command_id: int | None = None
    fence_after_s: float | None = None
    fence_grace_s: float | None = None
    requeue_after_s: float | None = None
    #: True: this portal answers heartbeats with ``heartbeat.ack`` when the hello asks for it, and fencing counts
    #: those answers; false (portals before them): it counts the pongs to WebSocket pings.
    heartbeat_acks: bool = False

    def __post_init__(self) -> None:
        for name in ("fence_after_s", "fence_grace_s", "requeue_after_s"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_FENCE_S:
                raise ProtocolError(ErrorCode.INVALID_FIELD, f"config.{name} must be from 0 to {MAX_FENCE_S} seconds")


@dataclass(kw_only=True)
class Error(Message):
    type: ClassVar[str] = "error"
    code: str
    detail: str = ""
    #: The ``id`` of the frame this error answers, when it could be read.
    ref_id: str | None = None


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.type: cls
    for cls in (
        Hello,
        Heartbeat,
        Telemetry,
        WorkloadStatus,
        WorkloadLog,
        Ack,
        HeartbeatAck,
        WorkloadStart,
        WorkloadStop,
        ReportAck,
        WorkloadLogAck,
        Config,
        Error,
    )
}
AGENT_TO_PORTAL: frozenset[str] = frozenset(
    {"hello", "heartbeat", "telemetry", "workload.status", "workload.log", "ack"}
)
PORTAL_TO_AGENT: frozenset[str] = frozenset(
    {"workload.start", "workload.stop", "report.ack", "workload.log.ack", "heartbeat.ack", "config", "error"}
)


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
    encoded = text if isinstance(text, bytes) else text.encode("utf-8")
    if len(encoded) > MAX_FRAME_BYTES:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"frame is {len(encoded)} bytes, over the limit of {MAX_FRAME_BYTES}")
    _check_depth_and_nul(encoded)
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(ErrorCode.MALFORMED, f"frame is not valid JSON: {exc}") from exc
    return from_dict(data)


# A JSON string (removed whole, so brackets inside it do not count); an innermost pair of brackets; a \u0000
# escape after an even number of backslashes (after an odd number it is an escaped backslash, not a NUL).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_INNERMOST_PAIR = re.compile(rb"\[\]|\{\}")
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
_ALL_BUT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_ALL_BUT_BRACKETS_AND_QUOTES = bytes(sorted(set(range(256)) - set(b'[]{}"')))


def _check_depth_and_nul(data: bytes) -> None:
    """Refuse, before parsing, a frame (UTF-8) nested deeper than :data:`MAX_FRAME_DEPTH` or carrying a NUL
    character (the portal's database cannot store one). The work is done in C: a frame with no more brackets than
    the limit is not scanned; otherwise its brackets, strings removed, lose their innermost pairs once per level."""
    if data.count(b"[") + data.count(b"{") > MAX_FRAME_DEPTH:
        if b'\\"' in data:
            marks = _STRING.sub(b"", data).translate(None, _ALL_BUT_BRACKETS)
        else:  # every quote opens or closes a string: keep brackets and quotes, then drop every other part
            marks = b"".join(data.translate(None, _ALL_BUT_BRACKETS_AND_QUOTES).split(b'"')[::2])
        for _level in range(MAX_FRAME_DEPTH):
            marks, pairs = _INNERMOST_PAIR.subn(b"", marks)
            if not marks:
                break
            if not pairs:
                raise ProtocolError(ErrorCode.MALFORMED, "frame is not valid JSON: its brackets do not balance")
        else:
            raise ProtocolError(
                ErrorCode.TOO_LARGE, f"frame nests objects and arrays more than {MAX_FRAME_DEPTH} levels deep"
            )
    if b"\\u0000" in data and _NUL_ESCAPE.search(data):
        raise ProtocolError(ErrorCode.INVALID_FIELD, "frame contains a NUL character (\\u0000) in a string")


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


# Validation is compiled once per type into a checker ``(value, where) -> value``: a 1,000-node fleet sends
# 8,000 device samples a second, and walking ``typing`` introspection for each value was most of decode's cost.
# Where a value sits (``telemetry.devices[3].util``) is built only for an error message: a checker gets the
# path as nested ``(parent, key)`` pairs, which cost nothing to make, and ``_at`` writes it out.
_Where = Any  # str | tuple[_Where, str | int]
_Checker = Callable[[Any, _Where], Any]
_FieldPlan = tuple[str, bool, _Checker, bool]  # name, required, checker, is a timestamp
_PLANS: dict[type, tuple[_FieldPlan, ...]] = {}


def _plan(cls: type) -> tuple[_FieldPlan, ...]:
    plan = _PLANS.get(cls)
    if plan is None:
        hints = typing.get_type_hints(cls)
        plan = _PLANS[cls] = tuple(
            (
                spec.name,
                spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING,
                _checker(hints[spec.name]),
                bool(spec.metadata.get("timestamp")),
            )
            for spec in dataclasses.fields(cls)
        )
    return plan


def _at(where: _Where) -> str:
    """The path ``(("telemetry", "devices"), 3)`` as ``telemetry.devices[3]``."""
    keys = []
    while isinstance(where, tuple):
        where, key = where
        keys.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    return where + "".join(reversed(keys))


def _build(cls: type, data: dict[str, Any], path: _Where) -> Any:
    kwargs: dict[str, Any] = {}
    for name, required, check, timestamp in _plan(cls):
        if name not in data:
            if required:
                raise ProtocolError(ErrorCode.INVALID_FIELD, f"{_at(path)}.{name} is required")
            continue
        where = (path, name)
        value = check(data[name], where)
        if timestamp and value is not None:
            try:
                parse_time(value)
            except ProtocolError as exc:
                raise ProtocolError(ErrorCode.INVALID_FIELD, f"{_at(where)}: {exc.detail}") from None
        kwargs[name] = value
    return cls(**kwargs)


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _check(hint: Any, value: Any, where: _Where) -> Any:
    """Return ``value`` converted to ``hint`` (nested dataclasses built), or raise invalid_field."""
    return _checker(hint)(value, where)


@functools.cache
def _checker(hint: Any) -> _Checker:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return _union_checker(typing.get_args(hint))
    if origin is Literal:
        return _literal_checker(typing.get_args(hint))
    if origin is list:
        (item,) = typing.get_args(hint)
        return _list_checker(_checker(item))
    if origin is dict:
        _key, item = typing.get_args(hint)
        return _dict_checker(_checker(item))
    if dataclasses.is_dataclass(hint):
        return _dataclass_checker(hint)
    if hint is Any:
        return _check_any
    scalar = _SCALARS.get(hint)
    if scalar is None:

        def unsupported(value: Any, where: _Where) -> Any:
            _not_null(value, where)
            raise TypeError(f"protocol field {_at(where)} has an unsupported type {_type_name(hint)}")

        return unsupported
    return scalar


def _union_checker(options: tuple[Any, ...]) -> _Checker:
    nullable = type(None) in options
    checks = [_checker(option) for option in options if option is not type(None)]

    def check(value: Any, where: _Where) -> Any:
        if value is None:
            if nullable:
                return None
            raise ProtocolError(ErrorCode.INVALID_FIELD, f"{_at(where)} must not be null")
        errors = []
        for option_check in checks:
            try:
                return option_check(value, where)
            except ProtocolError as exc:
                errors.append(exc.detail)
        raise ProtocolError(ErrorCode.INVALID_FIELD, errors[0] if len(errors) == 1 else f"{_at(where)} has a bad type")

    return check


def _literal_checker(allowed: tuple[Any, ...]) -> _Checker:
    def check(value: Any, where: _Where) -> Any:
        if value not in allowed or isinstance(value, bool):
            raise ProtocolError(ErrorCode.INVALID_FIELD, f"{_at(where)} is {value!r}; expected one of {list(allowed)}")
        return value

    return check


def _list_checker(item_check: _Checker) -> _Checker:
    def check(value: Any, where: _Where) -> Any:
        if not isinstance(value, list):
            raise ProtocolError(ErrorCode.INVALID_FIELD, f"{_at(where)} must be a list, not {type(value).__name__}")
        return [item_check(element, (where, i)) for i, element in enumerate(value)]

    return check


def _dict_checker(item_check: _Checker) -> _Checker:
    def check(value: Any, where: _Where) -> Any:
        if not isinstance(value, dict):
            raise ProtocolError(ErrorCode.INVALID_FIELD, f"{_at(where)} must be an object, not {type(value).__name__}")
        return {key: item_check(element, (where, key)) for key, element in value.items()}

    return check


def _dataclass_checker(cls: type) -> _Checker:
    def check(value: Any, where: _Where) -> Any:
        if not isinstance(value, dict):
            raise ProtocolError(ErrorCode.INVALID_FIELD, f"{_at(where)} must be an object, not {type(value).__name__}")
        return _build(cls, value, where)

    return check


def _not_null(value: Any, where: _Where) -> None:
    if value is None:
        raise ProtocolError(ErrorCode.INVALID_FIELD, f"{_at(where)} must not be null")


def _check_any(value: Any, where: _Where) -> Any:
    _not_null(value, where)
    return value


def _check_bool(value: Any, where: _Where) -> bool:
    _not_null(value, where)
    if not isinstance(value, bool):
        raise ProtocolError(ErrorCode.INVALID_FIELD, f"{_at(where)} must be true or false, not {value!r}")
    return value


def _check_int(value: Any, where: _Where) -> int:
    _not_null(value, where)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(ErrorCode.INVALID_FIELD, f"{_at(where)} must be an integer, not {value!r}")
    return value


def _check_float(value: Any, where: _Where) -> float:
    _not_null(value, where)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProtocolError(ErrorCode.INVALID_FIELD, f"{_at(where)} must be a number, not {value!r}")
    return float(value)


def _check_str(value: Any, where: _Where) -> str:
    _not_null(value, where)
    if not isinstance(value, str):
        raise ProtocolError(ErrorCode.INVALID_FIELD, f"{_at(where)} must be a string, not {value!r}")
    return value


_SCALARS: dict[Any, _Checker] = {bool: _check_bool, int: _check_int, float: _check_float, str: _check_str}
