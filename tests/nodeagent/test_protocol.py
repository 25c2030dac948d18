"""The v1 wire protocol: round trips and rejection of malformed frames (no Django)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta, timezone

import pytest

from nodeagent import protocol
from nodeagent.protocol import ErrorCode, ProtocolError


def _hello() -> protocol.Hello:
    return protocol.Hello(
        node_name="gpu-node-01",
        agent_version="0.1.0",
        hostname="gpu-node-01.example",
        cpu_cores=64,
        memory_mib=515_000,
        labels={"zone": "a"},
        topology=protocol.Topology(numa_nodes=[0, 1], pcie_switches=["sw0"], nvlink_domains=["nvl0"]),
        devices=[
            protocol.DeviceInfo(
                index=0,
                uuid="GPU-5a6b1c2d-0000-1111-2222-333344445555",
                vendor="nvidia",
                model="NVIDIA H100 80GB HBM3",
                memory_mib=81559,
                numa_node=0,
                pci_bus_id="00000000:18:00.0",
                mig_mode=False,
                nvlink_domain="nvl0",
                pcie_switch="sw0",
            )
        ],
        workloads=[protocol.RunningWorkload(job_id=7, replica=0, pid=4242, state="running")],
    )


def _all_messages() -> list[protocol.Message]:
    return [
        _hello(),
        protocol.Heartbeat(seq=3),
        protocol.Telemetry(
            samples=[
                protocol.DeviceSample(
                    uuid="GPU-1",
                    utilization_pct=55.0,
                    memory_used_mib=1000,
                    memory_total_mib=81559,
                    power_w=None,
                    processes=[protocol.ProcessSample(pid=1, used_memory_mib=1000)],
                )
            ],
            sampled_at=protocol.format_time(datetime(2026, 1, 1, tzinfo=UTC)),
            buffered=True,
        ),
        protocol.WorkloadStatus(
            job_id=7, replica=1, state="failed", exit_code=3, message="boom", log_tail="x\n", report_id=2**53 + 1
        ),
        protocol.Ack(command_id=12, ok=False, error="no such device"),
        protocol.WorkloadStart(
            command_id=5,
            job_id=7,
            replica=0,
            command=["python", "-c", "print(1)"],
            env={"A": "1"},
            devices=[protocol.DeviceAssignment(uuid="GPU-1", millis=500, memory_mib=20000)],
            checkpoint_dir="ckpt",
            max_runtime_s=3600,
        ),
        protocol.WorkloadStop(command_id=6, job_id=7, replica=0, grace_s=5, reason="preempted"),
        protocol.ReportAck(report_id=1_764_000_000_000_001, ok=False, code="invalid_transition", detail="no"),
        protocol.Config(telemetry_interval_s=2, heartbeat_interval_s=5, process_sample_interval_s=10),
        protocol.Error(code="malformed", detail="bad", ref_id="abc"),
        protocol.WorkloadLog(job_id=7, replica=1, offset=65536, text="epoch 3 loss 0.41 ✓\n"),
        protocol.WorkloadLogAck(job_id=7, replica=1, offset=65536, next_offset=65558, ok=False, code="not_allocated"),
    ]


@pytest.mark.parametrize("message", _all_messages(), ids=lambda m: m.type)
def test_every_message_type_survives_an_encode_decode_round_trip(message: protocol.Message) -> None:
    decoded = protocol.decode(protocol.encode(message))

    assert decoded == message
    assert type(decoded) is type(message)


def test_frame_carries_version_type_and_id_at_the_top_level() -> None:
    frame = json.loads(protocol.encode(protocol.Heartbeat(seq=1, id="m-1")))

    assert frame["v"] == 1
    assert frame["type"] == "heartbeat"
    assert frame["id"] == "m-1"
    assert frame["seq"] == 1


def test_nested_records_are_rebuilt_as_dataclasses() -> None:
    hello = protocol.decode(protocol.encode(_hello()))

    assert isinstance(hello, protocol.Hello)
    assert isinstance(hello.devices[0], protocol.DeviceInfo)
    assert hello.devices[0].memory_mib == 81559
    assert isinstance(hello.topology, protocol.Topology)
    assert hello.workloads[0].pid == 4242


def test_stored_payload_dict_decodes_like_text() -> None:
    start = _all_messages()[5]

    assert protocol.from_dict(protocol.to_dict(start)) == start


def test_integers_are_accepted_where_numbers_are_expected() -> None:
    stop = protocol.decode('{"v":1,"type":"workload.stop","id":"x","command_id":1,"job_id":2,"replica":0,"grace_s":3}')

    assert isinstance(stop, protocol.WorkloadStop)
    assert stop.grace_s == 3.0
    assert stop.reason == "cancelled"


def test_unknown_extra_fields_are_ignored_for_forward_compatibility() -> None:
    beat = protocol.decode('{"v":1,"type":"heartbeat","id":"x","seq":1,"future_field":true}')

    assert beat == protocol.Heartbeat(id="x", seq=1, sent_at=beat.sent_at)


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("not json", ErrorCode.MALFORMED),
        ("[1, 2]", ErrorCode.MALFORMED),
        ('{"type":"heartbeat","id":"x","seq":1}', ErrorCode.MALFORMED),
        ('{"v":2,"type":"heartbeat","id":"x","seq":1}', ErrorCode.UNSUPPORTED_VERSION),
        ('{"v":true,"type":"heartbeat","id":"x","seq":1}', ErrorCode.UNSUPPORTED_VERSION),
        ('{"v":1,"id":"x","seq":1}', ErrorCode.MALFORMED),
        ('{"v":1,"type":"reboot","id":"x"}', ErrorCode.UNKNOWN_TYPE),
        ('{"v":1,"type":"heartbeat","seq":1}', ErrorCode.MALFORMED),
        ('{"v":1,"type":"heartbeat","id":"","seq":1}', ErrorCode.MALFORMED),
        ('{"v":1,"type":"heartbeat","id":"x"}', ErrorCode.INVALID_FIELD),
        ('{"v":1,"type":"heartbeat","id":"x","seq":"1"}', ErrorCode.INVALID_FIELD),
        ('{"v":1,"type":"heartbeat","id":"x","seq":true}', ErrorCode.INVALID_FIELD),
        ('{"v":1,"type":"heartbeat","id":"x","seq":1.5}', ErrorCode.INVALID_FIELD),
        ('{"v":1,"type":"heartbeat","id":"x","seq":1,"sent_at":"yesterday"}', ErrorCode.INVALID_FIELD),
        ('{"v":1,"type":"heartbeat","id":"x","seq":1,"sent_at":"2026-01-01T00:00:00"}', ErrorCode.INVALID_FIELD),
        ('{"v":1,"type":"ack","id":"x","command_id":1,"ok":1}', ErrorCode.INVALID_FIELD),
        ('{"v":1,"type":"report.ack","id":"x"}', ErrorCode.INVALID_FIELD),
        ('{"v":1,"type":"report.ack","id":"x","report_id":0}', ErrorCode.INVALID_FIELD),
        ('{"v":1,"type":"report.ack","id":"x","report_id":9223372036854775808}', ErrorCode.INVALID_FIELD),
        ('{"v":1,"type":"report.ack","id":"x","report_id":"7"}', ErrorCode.INVALID_FIELD),
        (
            '{"v":1,"type":"workload.status","id":"x","job_id":1,"replica":0,"state":"running","report_id":-1}',
            ErrorCode.INVALID_FIELD,
        ),
        (
            '{"v":1,"type":"hello","id":"x","node_name":"n","agent_version":"1","hostname":"h","cpu_cores":1,'
            '"memory_mib":1,"workloads_complete":"yes"}',
            ErrorCode.INVALID_FIELD,
        ),
        (
            '{"v":1,"type":"workload.status","id":"x","job_id":1,"replica":0,"state":"exploded"}',
            ErrorCode.INVALID_FIELD,
        ),
        (
            '{"v":1,"type":"workload.start","id":"x","command_id":1,"job_id":1,"replica":0,"command":"ls"}',
            ErrorCode.INVALID_FIELD,
        ),
        (
            '{"v":1,"type":"workload.start","id":"x","command_id":1,"job_id":1,"replica":0,"command":["ls", 3]}',
            ErrorCode.INVALID_FIELD,
        ),
        (
            '{"v":1,"type":"workload.start","id":"x","command_id":1,"job_id":1,"replica":0,"command":[],"env":{"A":1}}',
            ErrorCode.INVALID_FIELD,
        ),
        (
            '{"v":1,"type":"workload.start","id":"x","command_id":1,"job_id":1,"replica":0,"command":[],'
            '"devices":[{"uuid":"GPU-1"}]}',
            ErrorCode.INVALID_FIELD,
        ),
        ('{"v":1,"type":"telemetry","id":"x","samples":[{"uuid":"GPU-1","power_w":NaN}]}', ErrorCode.MALFORMED),
        ('{"v":1,"type":"telemetry","id":"x","samples":{"uuid":"GPU-1"}}', ErrorCode.INVALID_FIELD),
        (
            '{"v":1,"type":"hello","id":"x","node_name":"n","agent_version":"1","hostname":"h","cpu_cores":1,'
            '"memory_mib":1,"workloads":[{"job_id":1,"replica":0,"pid":null,"state":null}]}',
            ErrorCode.INVALID_FIELD,
        ),
    ],
)
def test_malformed_frames_are_rejected_with_a_stable_code(text: str, code: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        protocol.decode(text)

    assert caught.value.code == code
    assert caught.value.detail


def test_invalid_field_error_names_the_field_path() -> None:
    text = (
        '{"v":1,"type":"workload.start","id":"x","command_id":1,"job_id":1,"replica":0,"command":[],'
        '"devices":[{"uuid":"GPU-1","millis":"half"}]}'
    )
    with pytest.raises(ProtocolError, match=r"workload\.start\.devices\[0\]\.millis"):
        protocol.decode(text)


@pytest.mark.parametrize(
    ("samples", "path"),
    [
        (
            '[{"uuid":"GPU-1"},{"uuid":"GPU-2","utilization_pct":"high"}]',
            r"^telemetry\.samples\[1\]\.utilization_pct must",
        ),
        (
            '[{"uuid":"GPU-1","processes":[{"used_memory_mib":1}]}]',
            r"^telemetry\.samples\[0\]\.processes\[0\]\.pid is required$",
        ),
        ("[{}]", r"^telemetry\.samples\[0\]\.uuid is required$"),
        ('{"uuid":"GPU-1"}', r"^telemetry\.samples must be a list"),
    ],
)
def test_a_nested_field_error_writes_out_its_whole_path(samples: str, path: str) -> None:
    # The path is kept as pairs while checking and written out only for the error (decode's hot loop).
    text = f'{{"v":1,"type":"telemetry","id":"x","sent_at":"2026-12-07T00:00:00+00:00","samples":{samples}}}'
    with pytest.raises(ProtocolError) as caught:
        protocol.decode(text)
    assert re.search(path, caught.value.detail), caught.value.detail


def test_a_bad_timestamp_names_its_field() -> None:
    text = '{"v":1,"type":"telemetry","id":"x","sent_at":"yesterday","samples":[]}'
    with pytest.raises(ProtocolError) as caught:
        protocol.decode(text)
    assert caught.value.detail.startswith("telemetry.sent_at: 'yesterday' is not"), caught.value.detail


def test_oversized_frame_is_rejected_on_decode_and_encode() -> None:
    big = "x" * (protocol.MAX_FRAME_BYTES + 1)
    with pytest.raises(ProtocolError) as on_decode:
        protocol.decode(big)
    assert on_decode.value.code == ErrorCode.TOO_LARGE

    with pytest.raises(ProtocolError) as on_encode:
        protocol.encode(protocol.WorkloadStatus(job_id=1, replica=0, state="failed", log_tail=big))
    assert on_encode.value.code == ErrorCode.TOO_LARGE


def test_timestamps_round_trip_as_aware_utc() -> None:
    moment = datetime(2026, 3, 1, 12, 0, tzinfo=timezone(timedelta(hours=8)))

    text = protocol.format_time(moment)

    assert text.endswith("+00:00")
    assert protocol.parse_time(text) == moment
    with pytest.raises(ValueError):
        protocol.format_time(datetime(2026, 3, 1))


def test_protocol_error_refuses_unknown_codes() -> None:
    with pytest.raises(ValueError):
        ProtocolError("oops", "x")


def test_message_directions_cover_every_type() -> None:
    assert set(protocol.MESSAGE_TYPES) == protocol.AGENT_TO_PORTAL | protocol.PORTAL_TO_AGENT
    assert not protocol.AGENT_TO_PORTAL & protocol.PORTAL_TO_AGENT


def test_frames_of_agents_before_the_outbox_are_still_accepted() -> None:
    status = protocol.decode('{"v":1,"type":"workload.status","id":"x","job_id":1,"replica":0,"state":"running"}')
    assert status.report_id is None
    hello = protocol.decode(
        '{"v":1,"type":"hello","id":"x","node_name":"n","agent_version":"0.9","hostname":"h","cpu_cores":1,'
        '"memory_mib":1,"workloads":[{"job_id":1,"replica":0,"pid":5,"state":"running"}]}'
    )
    assert hello.workloads_complete is False
    assert (hello.workloads[0].command_id, hello.workloads[0].exit_code) == (0, None)
