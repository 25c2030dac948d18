"""The gpupool-agent command line: register, credential file, demo command, and a real agent process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from websockets.asyncio.server import serve

from nodeagent import protocol
from nodeagent.cli import CliError, load_credential, main, save_credential
from nodeagent.demo import demo_agent_command, demo_agent_paths, write_bootstrap_token
from tests.nodeagent.sandboxing import SANDBOX_AVAILABLE, WORKLOAD_PYTHON, sandbox_args

REPO = Path(__file__).resolve().parents[2]


class FakePortal:
    """``POST /api/v1/agents/register/`` on a loopback port, answering like the fleet API."""

    def __init__(
        self, *, status: int = 201, answer: dict | None = None, first_statuses: list[int] | None = None
    ) -> None:
        self.requests: list[tuple[str, dict]] = []
        statuses = list(first_statuses or [])
        portal = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                portal.requests.append((self.path, body))
                current = statuses.pop(0) if statuses else status
                payload = json.dumps(answer if current != 502 and current != 503 else {"detail": "starting"}).encode()
                self.send_response(current)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakePortal:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_credential_file_is_written_with_mode_0600_even_over_a_readable_file(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "agent.json"
    path.parent.mkdir()
    path.write_text("{}")
    path.chmod(0o644)
    old_umask = os.umask(0)
    try:
        save_credential(path, {"credential": "secret", "node_name": "n"})
    finally:
        os.umask(old_umask)

    assert _mode(path) == 0o600
    assert load_credential(path)["credential"] == "secret"


def test_register_posts_the_token_and_saves_the_credential(tmp_path: Path) -> None:
    answer = {"node_id": 4, "node_name": "gpu-01", "credential": "gpc_abc", "ws_url": "/ws/agent/"}
    credential_file = tmp_path / "agent.json"
    with FakePortal(answer=answer) as portal:
        code = main(
            [
                "register",
                "--server",
                portal.url + "/",
                "--token",
                "gpb_tok",
                "--node-name",
                "gpu-01",
                "--credential-file",
                str(credential_file),
            ]
        )

    path, body = portal.requests[0]
    assert code == 0
    assert path == "/api/v1/agents/register/"
    assert body["token"] == "gpb_tok"
    assert body["node_name"] == "gpu-01"
    assert body["hostname"]
    assert body["agent_version"]
    saved = json.loads(credential_file.read_text())
    assert saved == {**answer, "server": portal.url}
    assert _mode(credential_file) == 0o600


def test_refused_registration_prints_the_portal_reason(tmp_path: Path, capsys) -> None:
    refusal = {"code": "token_used", "detail": "This bootstrap token was already used; tokens work once."}
    with FakePortal(status=403, answer=refusal) as portal:
        code = main(["register", "--server", portal.url, "--token", "t", "--credential-file", str(tmp_path / "c")])

    assert code == 2
    assert "token_used" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_unreachable_portal_is_reported_without_a_traceback(tmp_path: Path, capsys) -> None:
    code = main(
        ["register", "--server", "http://127.0.0.1:9", "--token", "t", "--credential-file", str(tmp_path / "c")]
    )

    assert code == 2
    assert "cannot reach the portal" in capsys.readouterr().err


def test_run_without_a_credential_file_says_how_to_register(tmp_path: Path) -> None:
    with pytest.raises(CliError, match="gpupool-agent register"):
        load_credential(tmp_path / "missing.json")


def test_missing_backend_exits_with_the_backend_message(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")

    code = main(["inventory", "--backend", "ascend"])

    assert code == 2
    assert "ascend: npu-smi not found" in capsys.readouterr().err


def test_inventory_prints_json(capsys) -> None:
    assert main(["inventory", "--backend", "simulated", "--cards", "2", "--model", "A100-40G"]) == 0

    report = json.loads(capsys.readouterr().out)
    assert report["backend"] == "simulated"
    assert [d["model"] for d in report["devices"]] == ["NVIDIA A100-SXM4-40GB"] * 2


def test_demo_agent_command_runs_a_simulated_node_with_its_own_files(tmp_path: Path) -> None:
    command = demo_agent_command(
        python="/usr/bin/python3", server_url="http://127.0.0.1:8000/", index=2, data_dir=tmp_path
    )
    paths = demo_agent_paths(index=2, data_dir=tmp_path)

    assert command[:4] == ["/usr/bin/python3", "-m", "nodeagent", "demo-run"]
    assert command[command.index("--node-name") + 1] == "sim-02"
    assert command[command.index("--bootstrap-token-file") + 1] == str(paths.token_file)
    assert command[command.index("--work-dir") + 1] == str(tmp_path.resolve() / "demo-agents" / "sim-02" / "work")
    assert command[command.index("--backend") + 1] == "simulated"
    write_bootstrap_token(paths.token_file, "gpb_x")
    assert _mode(paths.token_file) == 0o600
    # The demo uses the real sandbox where it can (root), and says which mode it runs.
    assert command[command.index("--sandbox") + 1] == ("namespaces" if SANDBOX_AVAILABLE else "none")
    assert "--sandbox" in demo_agent_command(python="p", server_url="u", index=0, data_dir=tmp_path, sandbox="none")
    # The demo's agents share one machine yet must not share ports or isolation rules: each has its own.
    commands = [demo_agent_command(python="p", server_url="u", index=i, data_dir=tmp_path) for i in range(3)]
    for option in ("--address", "--job-ports", "--network-table"):
        values = [c[c.index(option) + 1] for c in commands]
        assert len(set(values)) == 3, (option, values)
    assert [c[c.index("--address") + 1] for c in commands] == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]


def test_run_refuses_a_bad_sandbox_uid_range_and_describes_its_sandbox(tmp_path: Path) -> None:
    from nodeagent.cli import build_parser, make_sandbox

    args = build_parser().parse_args(["run", "--sandbox-uids", "0-10", "--work-dir", str(tmp_path)])
    with pytest.raises(CliError, match="start at 1000"):
        make_sandbox(args)
    args = build_parser().parse_args(["run", "--sandbox", "none", "--work-dir", str(tmp_path)])
    assert "unconfined" in make_sandbox(args).describe()


# --- a real agent process against a tiny WebSocket portal -----------------------------------------------------


async def test_agent_process_connects_runs_a_workload_and_stops_on_sigterm(tmp_path: Path) -> None:
    credential_file = tmp_path / "agent.json"
    save_credential(credential_file, {"node_name": "sim-e2e", "credential": "node-secret", "ws_url": "/ws/agent/"})
    frames: list[dict] = []
    hello_seen = asyncio.Event()
    finished = asyncio.Event()

    async def portal(websocket) -> None:
        assert websocket.request.headers["Authorization"] == "Bearer node-secret"
        async for text in websocket:
            frame = json.loads(text)
            frames.append(frame)
            if frame["type"] == "hello":
                hello_seen.set()
                uuid = frame["devices"][0]["uuid"]
                start = protocol.WorkloadStart(
                    command_id=1,
                    job_id=11,
                    replica=0,
                    command=[WORKLOAD_PYTHON, "-c", "import os; print('on', os.environ['CUDA_VISIBLE_DEVICES'])"],
                    devices=[protocol.DeviceAssignment(uuid=uuid, millis=1000)],
                )
                await websocket.send(protocol.encode(start))
            if frame["type"] == "workload.status" and frame["state"] == "succeeded":
                finished.set()

    async with serve(portal, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        agent = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "nodeagent",
            "run",
            "--server",
            f"http://127.0.0.1:{port}",
            "--credential-file",
            str(credential_file),
            "--backend",
            "simulated",
            "--cards",
            "2",
            "--work-dir",
            str(tmp_path / "work"),
            *sandbox_args(),
            cwd=REPO,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            await asyncio.wait_for(finished.wait(), timeout=30)
        finally:
            agent.send_signal(signal.SIGTERM)
            output, _ = await asyncio.wait_for(agent.communicate(), timeout=15)

    assert agent.returncode == 0, output.decode()
    hello = next(f for f in frames if f["type"] == "hello")
    assert hello["node_name"] == "sim-e2e"
    assert len(hello["devices"]) == 2
    status = next(f for f in frames if f.get("state") == "succeeded")
    assert status["log_tail"] == f"on {hello['devices'][0]['uuid']}"
    assert any(f["type"] == "ack" and f["command_id"] == 1 and f["ok"] for f in frames)
    assert any(f["type"] == "telemetry" for f in frames)


def test_demo_run_waits_for_a_starting_portal_then_registers_and_drops_the_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    answer = {"node_id": 1, "node_name": "sim-00", "credential": "gpc_demo", "ws_url": "/ws/agent/"}
    paths = demo_agent_paths(index=0, data_dir=tmp_path)
    write_bootstrap_token(paths.token_file, "gpb_demo")
    started: list[dict] = []
    monkeypatch.setattr("nodeagent.cli.run_agent", lambda args, credential: started.append(credential) or 0)
    monkeypatch.setattr("nodeagent.cli.time.sleep", lambda seconds: None)

    with FakePortal(answer=answer, first_statuses=[502, 503]) as portal:
        command = demo_agent_command(python=sys.executable, server_url=portal.url, index=0, data_dir=tmp_path)
        code = main(command[3:])

    assert code == 0
    assert len(portal.requests) == 3
    assert portal.requests[-1][1]["token"] == "gpb_demo"
    assert started[0]["credential"] == "gpc_demo"
    assert not paths.token_file.exists()
    assert _mode(paths.credential_file) == 0o600


def test_demo_run_gives_up_on_a_refused_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    paths = demo_agent_paths(index=0, data_dir=tmp_path)
    write_bootstrap_token(paths.token_file, "gpb_used")
    monkeypatch.setattr("nodeagent.cli.run_agent", lambda args, credential: pytest.fail("must not run"))

    with FakePortal(status=403) as portal:
        code = main(demo_agent_command(python=sys.executable, server_url=portal.url, index=0, data_dir=tmp_path)[3:])

    assert code == 2
    assert len(portal.requests) == 1
    assert "registration refused (403)" in capsys.readouterr().err
