"""``gpupool-agent``: register a node, run the agent, print the inventory.

gpupool-agent register --server https://pool.example --token <bootstrap token> [--node-name gpu-01]
gpupool-agent run [--backend nvml] [--work-dir /var/lib/gpupool-agent]
gpupool-agent inventory --backend nvml
gpupool-agent demo-run --server URL --node-name sim-00 --bootstrap-token-file F   (used by gpupool demo)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import stat
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from nodeagent import __version__, protocol
from nodeagent.agent import Agent, AgentSettings, websocket_connector, ws_url_for
from nodeagent.backends import BACKENDS, BackendUnavailable, DeviceBackend, load_backend
from nodeagent.backends.simulated import MODELS
from nodeagent.containers import find_runtime, runtime_labels
from nodeagent.fencing import DEFAULT_FENCE_GRACE_S, FenceSettings
from nodeagent.netpolicy import DEFAULT_TABLE, IsolationMode, NetworkIsolation
from nodeagent.outputs import OutputCollector
from nodeagent.sandbox import DEFAULT_PIDS_MAX, Sandbox, SandboxConfig, SandboxMode, parse_uid_range
from nodeagent.workloads import WorkloadRunner

log = logging.getLogger("nodeagent")
REGISTER_PATH = "/api/v1/agents/register/"


class CliError(Exception):
    """A problem the user fixes; printed without a traceback."""


class PortalUnreachable(CliError):
    """The portal did not answer (or answered 5xx): worth retrying while it starts."""


def _xdg(variable: str, fallback: str) -> Path:
    return Path(os.environ.get(variable) or Path.home() / fallback)


def default_credential_file() -> Path:
    configured = os.environ.get("GPUPOOL_AGENT_CREDENTIAL_FILE")
    return Path(configured) if configured else _xdg("XDG_CONFIG_HOME", ".config") / "gpupool" / "agent.json"


def default_work_dir() -> Path:
    configured = os.environ.get("GPUPOOL_AGENT_WORK_DIR")
    return Path(configured) if configured else _xdg("XDG_DATA_HOME", ".local/share") / "gpupool-agent"


# --- credential file ----------------------------------------------------------------------------------------


def save_credential(path: Path, data: dict[str, Any]) -> None:
    """Write the node credential readable by its owner only (0600), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(descriptor, 0o600)  # the umask can only narrow the mode; make sure it is exactly 0600
        os.write(descriptor, (json.dumps(data, indent=1) + "\n").encode())
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    os.replace(temporary, path)


def load_credential(path: Path) -> dict[str, Any]:
    try:
        mode = path.stat().st_mode
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CliError(
            f"no credential file at {path}; run `gpupool-agent register --server URL --token TOKEN` first"
        ) from None
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read the credential file {path}: {exc}") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("credential file %s is readable by others; run: chmod 600 %s", path, path)
    if not isinstance(data, dict) or not data.get("credential"):
        raise CliError(f"{path} holds no credential; register again")
    return data


# --- register -----------------------------------------------------------------------------------------------


def register(*, server: str, token: str, node_name: str, timeout_s: float = 15.0) -> dict[str, Any]:
    """Trade a bootstrap token for this node's credential at ``POST {server}/api/v1/agents/register/``."""
    url = server.rstrip("/") + REGISTER_PATH
    body = json.dumps(
        {"token": token, "node_name": node_name, "hostname": socket.gethostname(), "agent_version": __version__}
    ).encode()
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": f"gpupool-agent/{__version__}",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            answer = json.loads(response.read().decode())
    except urllib.error.HTTPError as exc:
        try:
            problem = json.loads(exc.read().decode())
            detail = problem.get("detail") or problem
            code = problem.get("code", exc.code)
        except (ValueError, AttributeError):
            detail, code = exc.reason, exc.code
        error = PortalUnreachable if exc.code >= 500 else CliError
        raise error(f"registration refused ({code}): {detail}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise PortalUnreachable(f"cannot reach the portal at {url}: {getattr(exc, 'reason', exc)}") from None
    if not isinstance(answer, dict) or not answer.get("credential"):
        raise CliError(f"the portal at {url} answered without a credential: {answer!r}")
    return {
        "server": server.rstrip("/"),
        "node_id": answer.get("node_id"),
        "node_name": answer.get("node_name", node_name),
        "credential": answer["credential"],
        "ws_url": answer.get("ws_url") or "/ws/agent/",
    }


def cmd_register(args: argparse.Namespace) -> int:
    data = register(server=args.server, token=args.token, node_name=args.node_name)
    save_credential(args.credential_file, data)
    print(f"registered node {data['node_name']} (id {data['node_id']}); credential saved to {args.credential_file}")
    return 0


# --- run ----------------------------------------------------------------------------------------------------


def _backend(args: argparse.Namespace, node_name: str) -> DeviceBackend:
    return load_backend(args.backend, node_name=node_name, cards=args.cards, model=args.model, seed=args.seed)


def _labels(pairs: list[str]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"--label {pair!r} must look like key=value")
        labels[key] = value
    return labels


def run_agent(args: argparse.Namespace, credential: dict[str, Any]) -> int:
    server = args.server or credential.get("server")
    if not server:
        raise CliError("no --server given and the credential file names none")
    node_name = credential.get("node_name") or socket.gethostname()
    backend = _backend(args, node_name)
    sandbox = make_sandbox(args)
    if sandbox.problem:
        # The agent still runs: the portal sees the node and each workload fails with this reason, where a
        # refusal to start would only leave the node silently missing.
        log.error("sandbox: %s; every workload will fail until this is fixed", sandbox.problem)
    runtime = find_runtime()
    network = make_network_isolation(args, sandbox)
    if network.problem:
        log.error("network isolation: %s; every sandboxed workload will fail until this is fixed", network.problem)
    runner = WorkloadRunner(
        work_dir=args.work_dir,
        device_indices={device.uuid: device.index for device in backend.inventory()},
        sandbox=sandbox,
        env_denylist=_env_denylist(args),
        container_runtime=runtime,
        network=network,
        shared_storage=args.shared_storage,
        outputs=OutputCollector(server=server, credential=credential["credential"]),
        job_dir_retention_s=args.job_dir_retention,
    )
    address = args.address or default_address(server)
    job_ports = ""
    if args.job_ports:
        try:
            job_ports = "{}-{}".format(*protocol.parse_port_range(args.job_ports))
        except ValueError as exc:
            raise CliError(f"--job-ports {exc}") from None
    settings = AgentSettings(
        node_name=node_name,
        telemetry_interval_s=args.telemetry_interval,
        heartbeat_interval_s=args.heartbeat_interval,
        # Image jobs go only to nodes whose hello says they have a container runtime.
        labels={**runtime_labels(runtime), **_labels(args.label)},
        stop_workloads_on_exit=args.stop_workloads_on_exit,
        fence=_fence_override(args),
        address=address,
        job_ports=job_ports,
    )
    url = ws_url_for(server, credential.get("ws_url") or "/ws/agent/")
    agent = Agent(
        settings=settings, backend=backend, runner=runner, connector=websocket_connector(url, credential["credential"])
    )
    log.info(
        "gpupool-agent %s: node %s at %s, backend %s, portal %s, work dir %s, sandbox %s, network isolation %s",
        __version__,
        node_name,
        address,
        backend.name,
        url,
        runner.work_dir,
        sandbox.describe(),
        network.describe,
    )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT)
        for signum in signals:
            loop.add_signal_handler(signum, stop.set)
        try:
            await agent.run(stop)
        finally:
            # Before the loop closes its wakeup fd: a late second signal must not hit a closed fd.
            for signum in signals:
                loop.remove_signal_handler(signum)
                signal.signal(signum, signal.SIG_IGN)

    asyncio.run(main())
    log.info("gpupool-agent stopped; running workloads keep running and are re-adopted on the next start")
    return 0


def make_sandbox(args: argparse.Namespace) -> Sandbox:
    """The sandbox of ``--sandbox`` (namespaces unless told otherwise), hiding the credential file."""
    try:
        uid_base, uid_count = parse_uid_range(args.sandbox_uids)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    credential = Path(args.credential_file).resolve()
    config = SandboxConfig(
        mode=SandboxMode(args.sandbox),
        uid_base=uid_base,
        uid_count=uid_count,
        pids_max=args.sandbox_pids_max or None,  # 0 means "no limit"
        hidden_files=(str(credential),),
        # The shared storage is hidden whole; each workload gets its tenant's part of it back (writable).
        hidden_dirs=tuple(
            str(Path(path).resolve())
            for path in [*args.sandbox_hide, *([args.shared_storage] if args.shared_storage else [])]
        ),
    )
    return Sandbox(config, work_dir=Path(args.work_dir).resolve())


def make_network_isolation(args: argparse.Namespace, sandbox: Sandbox) -> NetworkIsolation:
    """``--network-isolation`` (nftables unless told otherwise; nothing to isolate without the sandbox's uids)."""
    mode = IsolationMode(args.network_isolation)
    if sandbox.config.mode != SandboxMode.NAMESPACES:
        mode = IsolationMode.NONE  # workloads run as the agent's user: no uid to tell tenants apart by
    try:
        return NetworkIsolation(mode=mode, table=args.network_table, allow_from=tuple(args.network_allow_from))
    except ValueError as exc:
        raise CliError(str(exc)) from None


def default_address(server: str) -> str:
    """The address this node reaches the portal from: the one its peers most likely reach it by too (the
    interface of the route to the portal). Found with a UDP socket's ``connect``, which sends nothing."""
    parsed = urlsplit(server)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or (443 if parsed.scheme in ("https", "wss") else 80)
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family[0], socket.SOCK_DGRAM) as probe:
            probe.connect(family[4])
            return probe.getsockname()[0]
    except OSError:
        return socket.gethostname()


def _env_denylist(args: argparse.Namespace) -> tuple[str, ...]:
    if args.env_deny is None:
        return protocol.DEFAULT_ENV_DENYLIST
    return tuple(name.strip() for name in args.env_deny.split(",") if name.strip())


def cmd_run(args: argparse.Namespace) -> int:
    return run_agent(args, load_credential(args.credential_file))


def cmd_inventory(args: argparse.Namespace) -> int:
    backend = _backend(args, args.node_name)
    try:
        report = {
            "backend": backend.name,
            "topology": dataclasses.asdict(backend.topology()),
            "devices": [dataclasses.asdict(device) for device in backend.inventory()],
            "samples": [dataclasses.asdict(sample) for sample in backend.sample()],
        }
    finally:
        backend.close()
    print(json.dumps(report, indent=2))
    return 0


def cmd_demo_run(args: argparse.Namespace) -> int:
    """Register with the demo's one-time token (retrying while the portal starts), then run."""
    token_file: Path | None = args.bootstrap_token_file
    token = args.bootstrap_token or os.environ.get("GPUPOOL_DEMO_BOOTSTRAP_TOKEN", "")
    if not token and token_file is not None and token_file.exists():
        token = token_file.read_text().strip()
    if token:
        deadline = time.monotonic() + args.register_timeout
        while True:
            try:
                data = register(server=args.server, token=token, node_name=args.node_name)
                break
            except PortalUnreachable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)  # the portal is still starting
        save_credential(args.credential_file, data)
        if token_file is not None:
            token_file.unlink(missing_ok=True)  # one-time: a used token is useless, and a secret
        log.info("registered demo node %s", data["node_name"])
    return run_agent(args, load_credential(args.credential_file))


# --- parser -------------------------------------------------------------------------------------------------


def _add_backend_options(parser: argparse.ArgumentParser, *, default_backend: str) -> None:
    parser.add_argument(
        "--backend",
        default=default_backend,
        choices=[*sorted(BACKENDS), "auto"],
        help="device backend (auto: detect by PCI vendor id)",
    )
    parser.add_argument("--cards", type=int, default=8, help="simulated: number of cards")
    parser.add_argument("--model", default="H100-80G", choices=sorted(MODELS), help="simulated: card model")
    parser.add_argument("--seed", type=int, default=0, help="simulated: seed of the measurement noise")


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    _add_backend_options(parser, default_backend="auto")
    parser.add_argument("--credential-file", type=Path, default=default_credential_file())
    parser.add_argument("--work-dir", type=Path, default=default_work_dir(), help="workload dirs and state file")
    parser.add_argument("--telemetry-interval", type=float, default=1.0, help="seconds (the portal may override)")
    parser.add_argument("--heartbeat-interval", type=float, default=10.0, help="seconds (the portal may override)")
    parser.add_argument("--label", action="append", default=[], help="node label key=value (repeatable)")
    parser.add_argument(
        "--stop-workloads-on-exit",
        action="store_true",
        help="stop running workloads when the agent exits (default: leave them to be re-adopted)",
    )
    parser.add_argument(
        "--sandbox",
        choices=[mode.value for mode in SandboxMode],
        default=os.environ.get("GPUPOOL_AGENT_SANDBOX", SandboxMode.NAMESPACES.value),
        help="namespaces: each workload in its own uid, namespaces and cgroups (needs root); "
        "none: unconfined, as the agent's user (development only)",
    )
    parser.add_argument(
        "--sandbox-uids",
        default=os.environ.get("GPUPOOL_AGENT_SANDBOX_UIDS", "200000-265535"),
        help="uid range of workloads, one uid per tenant (base + tenant id)",
    )
    parser.add_argument(
        "--sandbox-pids-max",
        type=int,
        default=DEFAULT_PIDS_MAX,
        help="most processes and threads one workload may have (0: no limit)",
    )
    parser.add_argument(
        "--sandbox-hide",
        action="append",
        default=[],
        help="a directory workloads must not see, besides the work dir and credential (repeatable)",
    )
    parser.add_argument(
        "--address",
        default=os.environ.get("GPUPOOL_AGENT_ADDRESS", ""),
        help="the address other nodes reach this node by: a job's MASTER_ADDR and hostfile name it "
        "(default: the local address of the route to the portal)",
    )
    parser.add_argument(
        "--shared-storage",
        type=Path,
        default=os.environ.get("GPUPOOL_AGENT_SHARED_STORAGE") or None,
        help="where the shared file system is mounted on this node (the portal's GPUPOOL_SHARED_STORAGE): a "
        "workload sees only its tenant's part of it, and its job's checkpoint dir lives there",
    )
    parser.add_argument(
        "--job-dir-retention",
        type=float,
        default=float(os.environ.get("GPUPOOL_AGENT_JOB_DIR_RETENTION_S") or 86400),
        help="seconds a finished workload's job dir stays on the node (its log and outputs are on the portal)",
    )
    parser.add_argument(
        "--job-ports",
        default=os.environ.get("GPUPOOL_AGENT_JOB_PORTS", ""),
        help="the ports this node hands to jobs, first-last (default: the portal's GPUPOOL_JOB_PORT_RANGE); keep "
        "it below the kernel's ephemeral range (net.ipv4.ip_local_port_range)",
    )
    parser.add_argument(
        "--network-isolation",
        choices=[mode.value for mode in IsolationMode],
        default=os.environ.get("GPUPOOL_AGENT_NETWORK_ISOLATION", IsolationMode.NFTABLES.value),
        help="nftables: other tenants' jobs cannot connect to a job's sockets (needs the sandbox and nft); "
        "none: not isolated",
    )
    parser.add_argument(
        "--network-table",
        default=os.environ.get("GPUPOOL_AGENT_NETWORK_TABLE", DEFAULT_TABLE),
        help="the nftables table (family inet) this agent owns; one per agent on a machine",
    )
    parser.add_argument(
        "--network-allow-from",
        action="append",
        default=[],
        help="an address or network (CIDR) whose connections reach every job's sockets, e.g. the serving "
        "proxy's hosts (repeatable)",
    )
    parser.add_argument(
        "--env-deny",
        default=os.environ.get("GPUPOOL_AGENT_ENV_DENY"),
        help="comma-separated environment variables a job may not set ('X_*' is a prefix); "
        "default: LD_*, PATH and the other loader and libc variables",
    )
    parser.add_argument(
        "--fence-after",
        type=float,
        default=os.environ.get("GPUPOOL_AGENT_FENCE_AFTER_S") or None,  # argparse applies type= to it
        help="seconds without an answer from the portal after which every workload is stopped, so none runs "
        "twice once the portal moves it (0: never; default: what the portal says)",
    )
    parser.add_argument(
        "--fence-grace",
        type=float,
        default=os.environ.get("GPUPOOL_AGENT_FENCE_GRACE_S") or None,
        help="with --fence-after: seconds a fenced workload has between SIGTERM and SIGKILL to checkpoint (default 10)",
    )


def _fence_override(args: argparse.Namespace) -> FenceSettings | None:
    """Fencing from the command line, or None to follow the portal."""
    if args.fence_after is None:
        if args.fence_grace is not None:
            raise CliError("--fence-grace goes with --fence-after (without it the portal sets both)")
        return None
    if args.fence_after < 0 or (args.fence_grace is not None and args.fence_grace < 0):
        raise CliError("--fence-after and --fence-grace are seconds from 0")
    grace_s = args.fence_grace if args.fence_grace is not None else DEFAULT_FENCE_GRACE_S
    return FenceSettings(after_s=args.fence_after, grace_s=grace_s)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpupool-agent", description="gpupool node agent")
    parser.add_argument("--version", action="version", version=f"gpupool-agent {__version__}")
    parser.add_argument("--log-level", default=os.environ.get("GPUPOOL_AGENT_LOG_LEVEL", "INFO"))
    commands = parser.add_subparsers(dest="command", required=True)

    register_parser = commands.add_parser("register", help="trade a bootstrap token for a node credential")
    register_parser.add_argument("--server", required=True, help="portal URL, e.g. https://pool.example")
    register_parser.add_argument("--token", required=True, help="bootstrap token from a system admin")
    register_parser.add_argument("--node-name", default=socket.gethostname())
    register_parser.add_argument("--credential-file", type=Path, default=default_credential_file())
    register_parser.set_defaults(handler=cmd_register)

    run_parser = commands.add_parser("run", help="connect to the portal and run workloads")
    run_parser.add_argument("--server", help="portal URL (default: the one in the credential file)")
    _add_run_options(run_parser)
    run_parser.set_defaults(handler=cmd_run)

    inventory_parser = commands.add_parser("inventory", help="print this node's devices as JSON")
    _add_backend_options(inventory_parser, default_backend="auto")
    inventory_parser.add_argument("--node-name", default=socket.gethostname())
    inventory_parser.set_defaults(handler=cmd_inventory)

    demo_parser = commands.add_parser("demo-run", help="register with a one-time token if given, then run")
    demo_parser.add_argument("--server", required=True)
    demo_parser.add_argument("--node-name", required=True)
    demo_parser.add_argument("--bootstrap-token", default="")
    demo_parser.add_argument("--bootstrap-token-file", type=Path)
    demo_parser.add_argument("--register-timeout", type=float, default=120.0, help="seconds to wait for the portal")
    _add_run_options(demo_parser)
    # A demo's workloads die with the demo instead of lingering after Ctrl-C.
    demo_parser.set_defaults(handler=cmd_demo_run, backend="simulated", stop_workloads_on_exit=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return args.handler(args)
    except (CliError, BackendUnavailable) as exc:
        print(f"gpupool-agent: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
