"""The operators' deployment files (deploy/), checked without running Docker or systemd.

- compose.yaml: the Compose Specification's JSON Schema, the stack's shape (services, healthchecks, start order,
  one beat, web processes with GPUPOOL_DB_CONN_MAX_AGE=0), environment variables the code really reads, no
  secret but the marked placeholders; `docker compose config` where a Compose v2 client exists.
- The image's scripts: the simulated agents' slots, the enrol job's tokens.
- systemd units: ExecStart runs the package's console scripts with arguments their parsers accept; the agent
  keeps what its sandbox needs; `systemd-analyze verify` where it works.
- Grafana dashboard and Prometheus rules: every metric a query or rule reads is one /metrics really exports
  (scraped here from a small fleet), with the labels it really carries; the four operators' alerts; the
  Prometheus JSON Schemas; `promtool check` and `promtool test rules` where promtool is installed
  (scripts/test_prereqs.py).
"""

from __future__ import annotations

import configparser
import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
SCHEMAS = Path(__file__).with_name("schemas")
PLACEHOLDER = "EXAMPLE-ONLY-change-me"
UNITS = ["gpupool-web", "gpupool-worker", "gpupool-beat", "gpupool-agent"]
PORTAL_SERVICES = ["migrate", "enroll", "web-1", "web-2", "worker", "beat"]
# Metrics Prometheus makes itself for every target.
PROMETHEUS_SYNTHETIC = {"up": {"job", "instance"}}


# --- helpers ------------------------------------------------------------------------------------------------


def env_file(text: str) -> dict[str, str]:
    values = {}
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and not line.lstrip().startswith("#"):
            values[name.strip()] = value.strip()
    return values


INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def interpolate(value, env: dict[str, str]):
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?error}`` over a parsed document; ``$$`` stays."""
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def replace(match: re.Match) -> str:
        name, operator, argument = match.group(1), match.group(2), match.group(3)
        if env.get(name):
            return env[name]
        if operator and operator.endswith("?"):
            raise AssertionError(f"compose.yaml requires {name}: {argument}")
        return argument if operator and operator.endswith("-") else ""

    return INTERPOLATION.sub(replace, value.replace("$$", "\0")).replace("\0", "$$")


def interpolated_variables(document) -> set[str]:
    """The variables a parsed compose document interpolates (comments are not part of it)."""
    if isinstance(document, dict):
        return set().union(*(interpolated_variables(value) for value in document.values()))
    if isinstance(document, list):
        return set().union(*(interpolated_variables(value) for value in document))
    if isinstance(document, str):
        return {match[0] for match in INTERPOLATION.findall(document.replace("$$", ""))}
    return set()


def compose_text() -> str:
    return (DEPLOY / "compose.yaml").read_text()


@pytest.fixture
def example_env() -> dict[str, str]:
    return env_file((DEPLOY / ".env.example").read_text())


@pytest.fixture
def generated_env_file(tmp_path) -> Path:
    """deploy/.env as `python3 make-env.py > .env` makes it."""
    output = subprocess.run(
        [sys.executable, str(DEPLOY / "make-env.py")], check=True, capture_output=True, text=True
    ).stdout
    path = tmp_path / ".env"
    path.write_text(output)
    return path


@pytest.fixture
def compose(generated_env_file) -> dict:
    return interpolate(yaml.safe_load(compose_text()), env_file(generated_env_file.read_text()))


def code_reads_variables() -> set[str]:
    """GPUPOOL_* variables the packages read (env_str/int/float/bool/list, os.environ.get, os.getenv), and
    the bootstrap command's ``<ROLE>`` / ``<ROLE>_PASSWORD`` / ``<ROLE>_EMAIL`` family."""
    reader = re.compile(r"""(?:env_(?:str|int|float|bool|list)|environ\.get|getenv)\(\s*"(GPUPOOL_[A-Z0-9_]+)\"""")
    names: set[str] = set()
    for package in ["portal", "tenants", "scheduler", "audit", "nodeagent", "frontend"]:
        for path in (REPO / package).rglob("*.py"):
            names.update(reader.findall(path.read_text()))
    bootstrap = (REPO / "tenants/management/commands/bootstrap.py").read_text()
    for role in re.findall(r'"(GPUPOOL_BOOTSTRAP_[A-Z_]+)"', bootstrap):
        names.update({role, f"{role}_PASSWORD", f"{role}_EMAIL"})
    return names


def documented_text() -> str:
    return "\n".join(path.read_text() for path in (REPO / "docs").glob("*.md"))


def console_scripts() -> set[str]:
    return set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])


def check_command(argv: list[str]) -> None:
    """``argv`` is a gpupool/gpupool-agent/celery command line whose program and arguments really exist."""
    program = Path(argv[0]).name
    if program == "gpupool":
        from django.core.management import get_commands, load_command_class

        name = argv[1]
        assert name in get_commands(), f"`gpupool {name}` is no management command"
        command = load_command_class(get_commands()[name], name)
        command.create_parser("gpupool", name).parse_args(argv[2:])
    elif program == "gpupool-agent":
        from nodeagent.cli import build_parser

        build_parser().parse_args(argv[1:])
    elif program == "celery":
        assert argv[1:3] == ["-A", "portal"], argv
        assert argv[3] in {"worker", "beat", "inspect"}, argv
        assert any(dependency.startswith("celery") for dependency in project_dependencies())
    else:
        raise AssertionError(f"{argv[0]} is neither a console script of the package nor celery")


def project_dependencies() -> list[str]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]


# --- docker compose -----------------------------------------------------------------------------------------


def test_compose_file_follows_the_compose_specification(compose):
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text())
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(compose), key=lambda error: list(error.path))
    assert not errors, [f"{list(error.path)}: {error.message}" for error in errors]


def test_compose_runs_the_whole_stack_in_order_with_healthchecks(compose, generated_env_file):
    services = compose["services"]
    for name in ["postgres", "redis", *PORTAL_SERVICES, "proxy", "agent"]:
        assert name in services, f"compose.yaml has no {name} service"
    for name in [*PORTAL_SERVICES, "agent"]:
        build = services[name]["build"]
        assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile"
    for name in ["postgres", "redis", "web-1", "web-2", "worker", "proxy", "agent"]:
        assert services[name]["healthcheck"]["test"], f"{name} has no healthcheck"

    def waits_for(service: str, dependency: str, condition: str) -> bool:
        return services[service]["depends_on"].get(dependency, {}).get("condition") == condition

    assert waits_for("migrate", "postgres", "service_healthy")
    for name in ["web-1", "web-2", "worker", "beat", "enroll"]:
        assert waits_for(name, "migrate", "service_completed_successfully"), name
    assert services["migrate"]["restart"] == services["enroll"]["restart"] == "no"
    assert waits_for("proxy", "web-1", "service_healthy") and waits_for("proxy", "web-2", "service_healthy")
    assert waits_for("agent", "enroll", "service_completed_successfully")
    # Exactly one beat: one service, never scaled.
    beats = [name for name, service in services.items() if "beat" in service.get("command", [])]
    assert beats == ["beat"] and "deploy" not in services["beat"]
    # Web processes never keep connections (docs/production.md); the worker may.
    for name in ["web-1", "web-2"]:
        assert services[name]["environment"]["GPUPOOL_DB_CONN_MAX_AGE"] == "0"
        assert services[name]["command"][:2] == ["gpupool", "serve"]
    assert services["worker"]["environment"]["GPUPOOL_DB_CONN_MAX_AGE"] == "60"
    # The agents: as many as SIM_AGENTS (enroll issues that many slots' tokens), on the simulated backend.
    sim_agents = env_file(generated_env_file.read_text())["SIM_AGENTS"]
    assert str(services["agent"]["deploy"]["replicas"]) == sim_agents
    assert services["enroll"]["environment"]["SIM_AGENTS"] == sim_agents
    assert "GPUPOOL_DATABASE_URL" not in services["agent"]["environment"]  # agents never hold DB credentials


def test_compose_commands_and_scripts_exist_and_parse(compose):
    for name, service in compose["services"].items():
        command = service.get("command")
        if not command or ("image" in service and "build" not in service):
            continue  # third-party images
        if command[0].startswith("/opt/gpupool/bin/"):
            assert (DEPLOY / "docker" / Path(command[0]).name).is_file(), name
        elif command[0] == "python":
            assert (DEPLOY / "docker" / Path(command[1]).name).is_file(), name
        else:
            check_command(command)
    from django.core.management import get_commands

    for script in (DEPLOY / "docker").glob("*.sh"):
        for command in re.findall(r"^\s*gpupool ([a-z_]+)", script.read_text(), re.M):
            assert command in get_commands(), f"{script.name}: `gpupool {command}` is no management command"


def test_compose_environment_only_sets_variables_the_code_reads_and_the_docs_explain(example_env):
    parsed = yaml.safe_load(compose_text())
    known, docs = code_reads_variables(), documented_text()
    for name, service in parsed["services"].items():
        environment = service.get("environment") or {}
        for variable in environment:
            if variable.startswith("GPUPOOL_"):
                assert variable in known, f"{name} sets {variable}, which no code reads"
                assert variable in docs, f"{variable} ({name}) is not explained in docs/"
    # Every ${VARIABLE} compose.yaml interpolates is in .env.example, commented in or out, which says what it is.
    example_text = (DEPLOY / ".env.example").read_text()
    for variable in interpolated_variables(parsed):
        assert re.search(rf"^#? ?{variable}=", example_text, re.M), f"{variable} is not in .env.example"
    for variable in example_env:
        if variable.startswith("GPUPOOL_"):
            assert variable in known, f".env.example sets {variable}, which no code reads"


def test_no_secret_is_written_into_the_files_except_marked_placeholders(example_env):
    secret_like = re.compile(r"SECRET|PASSWORD|_KEY|TOKEN|MASTER_KEYS")
    parsed = yaml.safe_load(compose_text())
    for name, service in parsed["services"].items():
        for variable, value in (service.get("environment") or {}).items():
            if secret_like.search(variable) and value:
                assert str(value).startswith("${"), f"{name}: {variable} is written into compose.yaml"
        for variable, value in (service.get("environment") or {}).items():
            if variable == "GPUPOOL_DATABASE_URL":
                assert re.match(r"postgres://\w+:\$\{", value), f"{name}: a database password in compose.yaml"
    for variable, value in example_env.items():
        if secret_like.search(variable):
            assert value == PLACEHOLDER, f".env.example: {variable} should be the placeholder"
    for variable, value in env_file((DEPLOY / "systemd" / "gpupool.env.example").read_text()).items():
        if secret_like.search(variable) or variable == "GPUPOOL_DATABASE_URL":
            assert PLACEHOLDER in value, f"gpupool.env.example: {variable} should hold the placeholder"


def test_make_env_fills_every_placeholder_with_a_value_production_accepts(generated_env_file, settings):
    from audit import conf
    from portal.settings import DEFAULT_SECRET_KEY

    values = env_file(generated_env_file.read_text())
    assert PLACEHOLDER not in generated_env_file.read_text()
    assert len(values["GPUPOOL_SECRET_KEY"]) >= 50 and values["GPUPOOL_SECRET_KEY"] != DEFAULT_SECRET_KEY
    settings.GPUPOOL_AUDIT_REQUIRE_REAL_KEYS = True
    settings.GPUPOOL_AUDIT_MASTER_KEYS = values["GPUPOOL_AUDIT_MASTER_KEYS"]
    settings.GPUPOOL_AUDIT_SIGNING_KEY = values["GPUPOOL_AUDIT_SIGNING_KEY"]
    assert [len(key) for _kid, key in conf.master_keys()] == [32]
    assert len(conf.signing_seed()) == 32
    again = env_file(
        subprocess.run([sys.executable, str(DEPLOY / "make-env.py")], check=True, capture_output=True, text=True).stdout
    )
    assert again["GPUPOOL_SECRET_KEY"] != values["GPUPOOL_SECRET_KEY"]  # fresh secrets every time


def docker_compose() -> list[str] | None:
    """The Compose v2 client: `docker compose` (plugin) or a `docker-compose` v2 binary; None when absent."""
    candidates = [["docker", "compose"]] if shutil.which("docker") else []
    if shutil.which("docker-compose"):
        candidates.append(["docker-compose"])
    for candidate in candidates:
        try:
            answer = subprocess.run([*candidate, "version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if answer.returncode == 0 and re.search(r"v?2\.\d+", answer.stdout):
            return candidate
    return None


@pytest.mark.parametrize("profile", [[], ["--profile", "monitoring"]], ids=["stack", "with-monitoring"])
def test_docker_compose_config_accepts_the_stack(generated_env_file, profile):
    client = docker_compose()
    if client is None:
        pytest.skip("no Docker Compose v2 client here (`docker compose` / docker-compose v2); the schema test ran")
    files = [
        "--project-directory",
        str(DEPLOY),
        "--env-file",
        str(generated_env_file),
        "-f",
        str(DEPLOY / "compose.yaml"),
    ]
    answer = subprocess.run(
        [*client, *files, *profile, "config", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert answer.returncode == 0, answer.stderr
    resolved = json.loads(answer.stdout)
    sim_agents = int(env_file(generated_env_file.read_text())["SIM_AGENTS"])
    assert resolved["services"]["agent"]["deploy"]["replicas"] == sim_agents
    assert ("grafana" in resolved["services"]) == bool(profile)


def test_dockerfile_installs_the_package_from_a_context_that_holds_every_package():
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.1[1-3]-slim", dockerfile, re.M)
    assert re.search(r"^RUN pip install \.", dockerfile, re.M)
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    first_rule = next(line for line in ignore if line and not line.startswith("#"))
    assert first_rule == "**", "Dockerfile.dockerignore must exclude everything first, then allow"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    needed = {"pyproject.toml", project["project"]["readme"], "deploy/docker"}
    needed |= {package.rstrip("*.") for package in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert needed <= allowed, f"Dockerfile.dockerignore keeps {sorted(needed - allowed)} out of the image"
    for source in re.findall(r"^COPY (\S+) ", dockerfile, re.M):
        assert source == "." or (REPO / source).exists(), f"COPY {source}: not in the repository"


def test_caddy_proxies_to_every_web_service_and_caddy_accepts_the_file(compose, tmp_path):
    caddyfile = (DEPLOY / "Caddyfile").read_text()
    web = sorted(name for name in compose["services"] if name.startswith("web-"))
    for upstreams in re.findall(r"reverse_proxy ([^{\n]+)", caddyfile):
        assert sorted(upstream.split(":")[0] for upstream in upstreams.split()) == web
    assert "tls internal" in caddyfile
    agent_server = compose["services"]["agent"]["environment"]["SIM_AGENT_SERVER"]
    assert agent_server == "http://proxy:8080" and re.search(r"^:8080 \{", caddyfile, re.M)
    if not shutil.which("caddy"):
        pytest.skip("caddy is not installed; the Caddyfile's structure was checked")
    answer = subprocess.run(
        ["caddy", "adapt", "--adapter", "caddyfile", "--config", str(DEPLOY / "Caddyfile")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PORTAL_HOSTNAME": "pool.example.com", "HOME": str(tmp_path)},
    )
    assert answer.returncode == 0, answer.stderr
    assert "pool.example.com" in answer.stdout
    assert "not formatted" not in answer.stderr


# --- the image's scripts --------------------------------------------------------------------------------------


def fake_program(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def test_simulated_agents_claim_distinct_slots_that_outlive_them(tmp_path):
    """Replicas of one service each take a slot (node sim-NN) while they live; a slot freed by a stopped
    container is taken again by the next, with its credential, so a node keeps its name across recreations."""
    from nodeagent.cli import build_parser

    state, bin_dir = tmp_path / "state", tmp_path / "bin"
    bin_dir.mkdir()
    (state / "tokens").mkdir(parents=True)
    for slot in ("slot-00", "slot-01"):
        (state / "tokens" / f"{slot}.token").write_text("gpb_token\n")
    # The agent stands in: records its command line, then lives until told to stop.
    fake_program(bin_dir, "gpupool-agent", 'echo "$@" > "$SIM_AGENT_STATE_DIR/argv-$$"; exec sleep 30')
    environment = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SIM_AGENT_STATE_DIR": str(state),
        "SIM_AGENT_SERVER": "http://proxy:8080",
        "SIM_AGENT_CARDS": "4",
    }

    def start(slot_file: str, *, agents_running: int) -> subprocess.Popen:
        environment_of_one = {**environment, "SIM_AGENT_SLOT_FILE": str(tmp_path / slot_file)}
        process = subprocess.Popen([sys.executable, str(DEPLOY / "docker" / "sim_agent.py")], env=environment_of_one)
        deadline = time.monotonic() + 20
        while not ((tmp_path / slot_file).exists() and len(list(state.glob("argv-*"))) == agents_running):
            assert process.poll() is None, "sim_agent.py exited"
            assert time.monotonic() < deadline, "the agent did not start"
            time.sleep(0.05)
        return process

    first = start("first", agents_running=1)
    second = start("second", agents_running=2)
    try:
        argvs = sorted(path.read_text().split() for path in state.glob("argv-*"))
        names = sorted(argv[argv.index("--node-name") + 1] for argv in argvs)
        assert names == ["sim-00", "sim-01"]
        for argv in argvs:
            arguments = build_parser().parse_args(argv)  # what the real agent would accept
            assert arguments.command == "demo-run" and arguments.cards == 4
            assert arguments.bootstrap_token_file.name == f"{Path(arguments.credential_file).parent.name}.token"
        assert (tmp_path / "first").read_text().endswith("slot-00/agent.json")
    finally:
        first.terminate()
        first.wait(timeout=10)
    # The first container is gone and its slot registered meanwhile: the next one takes slot 00, no token needed.
    (state / "slot-00" / "agent.json").write_text("{}")
    for path in state.glob("argv-*"):
        path.unlink()
    third = start("third", agents_running=1)
    try:
        (argv,) = [path.read_text().split() for path in state.glob("argv-*")]
        assert argv[argv.index("--node-name") + 1] == "sim-00"
        assert "--bootstrap-token-file" not in argv
    finally:
        for process in (second, third):
            process.terminate()
            process.wait(timeout=10)


def test_an_agent_without_credential_or_token_says_how_to_get_one(tmp_path):
    answer = subprocess.run(
        [sys.executable, str(DEPLOY / "docker" / "sim_agent.py")],
        env={**os.environ, "SIM_AGENT_STATE_DIR": str(tmp_path), "SIM_AGENT_SLOT_FILE": str(tmp_path / "slot")},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert answer.returncode != 0
    assert "raise SIM_AGENTS" in answer.stderr


def test_enroll_issues_tokens_only_for_slots_that_have_not_registered(tmp_path):
    state, bin_dir = tmp_path / "state", tmp_path / "bin"
    bin_dir.mkdir()
    (state / "slot-01").mkdir(parents=True)
    (state / "slot-01" / "agent.json").write_text('{"credential": "gpn_x"}')
    # The management command stands in: records its arguments (tab-separated), prints a token.
    fake_program(
        bin_dir,
        "gpupool",
        'printf "%s\\t" "$@" >> "$SIM_AGENT_STATE_DIR/calls"; echo >> "$SIM_AGENT_STATE_DIR/calls"; echo gpb_secret',
    )
    answer = subprocess.run(
        ["sh", str(DEPLOY / "docker" / "enroll.sh")],
        env={
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "SIM_AGENT_STATE_DIR": str(state),
            "SIM_AGENTS": "3",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert answer.returncode == 0, answer.stderr
    assert sorted(path.name for path in (state / "tokens").iterdir()) == ["slot-00.token", "slot-02.token"]
    assert (state / "tokens" / "slot-00.token").read_text().startswith("gpb_secret")
    assert oct((state / "tokens" / "slot-00.token").stat().st_mode & 0o777) == oct(0o600)
    calls = [line.rstrip("\t").split("\t") for line in (state / "calls").read_text().splitlines()]
    assert len(calls) == 2
    for call in calls:
        check_command(["gpupool", *call])


# --- systemd ------------------------------------------------------------------------------------------------


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # keys are case-sensitive
    parser.read(DEPLOY / "systemd" / f"{name}.service")
    return parser


def test_units_start_the_package_s_console_scripts_with_arguments_they_accept():
    scripts = console_scripts()
    for name in UNITS:
        service = unit(name)["Service"]
        argv = shlex.split(service["ExecStart"])
        assert argv[0].startswith("/opt/gpupool/bin/")
        assert Path(argv[0]).name in scripts | {"celery"}
        check_command([Path(argv[0]).name, *argv[1:]])
        assert unit(name)["Install"]["WantedBy"] == "multi-user.target"
    for name in ["gpupool-web", "gpupool-worker", "gpupool-beat"]:
        service = unit(name)["Service"]
        assert service["EnvironmentFile"] == "/etc/gpupool/gpupool.env"
        assert service["User"] == "gpupool" and service["NoNewPrivileges"] == "yes"
        assert service["ProtectSystem"] == "strict"
    assert "GPUPOOL_DB_CONN_MAX_AGE=0" in unit("gpupool-web")["Service"]["Environment"]
    assert "GPUPOOL_DB_CONN_MAX_AGE=60" in unit("gpupool-worker")["Service"]["Environment"]
    # EnvironmentFile= overrides Environment=: the shared file must leave the connection age to the units.
    assert "GPUPOOL_DB_CONN_MAX_AGE" not in env_file((DEPLOY / "systemd" / "gpupool.env.example").read_text())


def test_the_agent_unit_keeps_what_the_workload_sandbox_needs():
    service = unit("gpupool-agent")["Service"]
    assert service["User"] == "root"
    assert service["Delegate"] == "yes"  # its workloads' cgroups live below its own
    assert service["KillMode"] == "process"  # restarting the agent leaves running workloads to be re-adopted
    assert service["TasksMax"] == "infinity"
    # Each of these stops the sandbox from being built, or is inherited by every workload (docs/sandbox.md).
    for option in [
        "ProtectSystem",
        "ProtectHome",
        "PrivateTmp",
        "PrivateDevices",
        "DeviceAllow",
        "ProtectClock",
        "ProtectControlGroups",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "RestrictNamespaces",
        "SystemCallFilter",
        "CapabilityBoundingSet",
        "NoNewPrivileges",
        "MemoryDenyWriteExecute",
    ]:
        assert option not in service, f"gpupool-agent.service sets {option}, which breaks the workload sandbox"
    # A GPU node runs tenants' code: it gets its own optional env file, never the portal's secrets.
    assert service["EnvironmentFile"] == "-/etc/gpupool/agent.env"
    assert unit("gpupool-agent")["Unit"]["ConditionPathExists"] == "/etc/gpupool/agent.json"
    argv = shlex.split(service["ExecStart"])
    assert argv[argv.index("--credential-file") + 1] == "/etc/gpupool/agent.json"


def systemd_analyze_works(tmp_path: Path) -> bool:
    if not shutil.which("systemd-analyze"):
        return False
    probe = tmp_path / "probe.service"
    probe.write_text("[Service]\nExecStart=/bin/true\n")
    try:
        answer = subprocess.run(
            ["systemd-analyze", "verify", "--man=no", str(probe)], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return answer.returncode == 0


def test_systemd_analyze_verify_accepts_the_units(tmp_path):
    if not systemd_analyze_works(tmp_path):
        pytest.skip("systemd-analyze verify does not work here; the units were parsed and checked above")
    # A root with systemd's own units and stand-ins for the executables (verify checks that they exist).
    root = tmp_path / "root"
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    (root / "etc/systemd/system").mkdir(parents=True)
    for name in UNITS:
        executable = root / shlex.split(unit(name)["Service"]["ExecStart"])[0].lstrip("/")
        executable.parent.mkdir(parents=True, exist_ok=True)
        executable.write_text("#!/bin/sh\n")
        executable.chmod(0o755)
        shutil.copy(DEPLOY / "systemd" / f"{name}.service", root / "etc/systemd/system")
    for name in UNITS:
        answer = subprocess.run(
            ["systemd-analyze", "verify", "--man=no", f"--root={root}", f"{name}.service"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        complaints = [line for line in answer.stderr.splitlines() if name in line or "Unknown" in line]
        assert answer.returncode == 0 and not complaints, answer.stderr


# --- metrics: what /metrics exports -------------------------------------------------------------------------


@pytest.fixture
def exported(db, settings, monkeypatch) -> dict[str, set[str]]:
    """Metric family → label names, scraped from /metrics over a small fleet that gives every family a sample."""
    import datetime as dt
    import uuid

    from django.test import Client
    from django.utils import timezone

    from scheduler.fleet import metrics, selectors
    from scheduler.fleet.models import Device
    from scheduler.fleet.services.inventory import node_hello
    from scheduler.fleet.telemetry import latest_store
    from scheduler.models import Allocation, Job, JobState
    from tenants.services.quotas import quota_set
    from tests.factories import TenantFactory
    from tests.fleet.conftest import hello, register_node
    from tests.patching import patch_imported

    settings.GPUPOOL_TELEMETRY_KEY_PREFIX = f"test-deploy-{uuid.uuid4().hex[:10]}"
    patch_imported(monkeypatch, "scheduler.fleet.services.notify.cycle_request_after_commit", lambda: None)
    node, _credential = register_node("gpu-01")
    node_hello(node_id=node.pk, hello=dataclasses.asdict(hello("gpu-01", devices=2)))
    device = Device.objects.get(uuid="GPU-gpu-01-0")
    tenant = TenantFactory(slug="vision")
    quota_set(actor=None, tenant=tenant, flavor=device.flavor, values={"guaranteed_millis": 1000, "limit_millis": 2000})
    now = timezone.now()
    job = Job.objects.create(
        tenant=tenant, name="train", millis_per_replica=500, flavors=[device.flavor.name], state=JobState.RUNNING
    )
    Job.objects.filter(pk=job.pk).update(queued_at=now - dt.timedelta(seconds=30), admitted_at=now)
    Job.objects.create(tenant=tenant, name="waits", millis_per_replica=1000, state=JobState.QUEUED, queued_at=now)
    Allocation.objects.create(
        job=job,
        replica=0,
        tenant=tenant,
        flavor=device.flavor,
        device=device,
        node=node,
        millis=500,
        memory_mib=1000,
        started_at=now,
    )
    values = {name: 1 for _metric, _help, name in metrics.DEVICE_METRICS} | {"memory_total_mib": 81559}
    latest_store().put(node.pk, {"GPU-gpu-01-0": values, "GPU-gpu-01-1": values})
    settings.GPUPOOL_METRICS_TOKEN = "scrape-secret"
    response = Client().get("/metrics", headers={"Authorization": "Bearer scrape-secret"})
    assert response.status_code == 200
    text = response.content.decode()
    snapshot = selectors.metrics_snapshot()
    if snapshot["database_deadlocks"] is None:  # SQLite: PostgreSQL's counter is the only family missing
        snapshot["database_deadlocks"] = 0
        text += metrics.render_metrics(snapshot)
    families: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            families.setdefault(line.split()[2], set())
        elif line and not line.startswith("#"):
            name, _, rest = line.partition("{")
            families.setdefault(name.split()[0], set()).update(re.findall(r'([A-Za-z_]\w*)="', rest))
    empty = [name for name, labels in families.items() if not labels and f"\n{name} " not in f"\n{text}"]
    assert not empty, f"no sample of {empty}: give the fleet one so their labels are checked"
    return {**families, **PROMETHEUS_SYNTHETIC}


PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"}


def promql_selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names it filters on or groups by) for every metric an expression reads."""
    grouping = {
        label.strip() for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr) for label in group.split(",")
    }
    found = []
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)  # strings out first: they may hold anything
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    for match in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{[^}]*\})?\s*(\()?", text):
        name, matchers, call = match.groups()
        if call or name in PROMQL_WORDS or re.fullmatch(r"\d.*|e\d*|Inf|NaN", name):
            continue
        labels = set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", matchers or ""))
        found.append((name, labels | grouping))
    return found


def assert_reads_exported(expr: str, exported: dict[str, set[str]], where: str) -> None:
    selectors = promql_selectors(expr)
    assert selectors, f"{where}: no metric in {expr!r}"
    for name, labels in selectors:
        assert name in exported, f"{where}: {name} is not exported by /metrics ({expr})"
        grouped_elsewhere = {label for label in labels if label not in exported[name]}
        # A `by (x)` applies to the whole aggregation: every metric in it must carry x.
        assert not grouped_elsewhere, f"{where}: {name} has no label(s) {sorted(grouped_elsewhere)} ({expr})"


def test_the_promql_reader_finds_metrics_and_their_labels():
    found = promql_selectors('100 * sum by (tenant) (a_total{x="b{c}", y=~"$t"}) / sum(rate(b[5m])) > 0 or vector(0)')
    assert found == [("a_total", {"tenant", "x", "y"}), ("b", {"tenant"})]


# --- Grafana ------------------------------------------------------------------------------------------------


def dashboard() -> dict:
    return json.loads((DEPLOY / "grafana" / "gpupool.json").read_text())


def all_panels(document: dict) -> list[dict]:
    panels = []
    for panel in document["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return panels


def test_dashboard_queries_read_only_metrics_and_labels_the_exporter_emits(exported):
    document = dashboard()
    queries = 0
    for panel in all_panels(document):
        for target in panel.get("targets", []):
            assert_reads_exported(target["expr"], exported, f"panel {panel['title']!r}")
            queries += 1
    assert queries >= 20
    for variable in document["templating"]["list"]:
        if variable["type"] != "query":
            continue
        selector, label = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["definition"]).groups()
        pattern = re.fullmatch(r'\{__name__=~"([^"]+)"\}', selector)
        names = [name for name in exported if re.fullmatch(pattern.group(1), name)] if pattern else [selector]
        assert names and all(label in exported[name] for name in names), variable["definition"]


def test_dashboard_covers_pool_tenants_cards_queue_and_audit_on_a_templated_datasource():
    document = dashboard()
    rows = [panel["title"] for panel in document["panels"] if panel["type"] == "row"]
    for section in ["Pool", "Tenants", "Queue", "Cards", "Audit"]:
        assert any(row.startswith(section) for row in rows), f"no {section} row"
    variables = {variable["name"]: variable for variable in document["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource" and variables["DS_PROMETHEUS"]["query"] == "prometheus"
    panels = [panel for panel in all_panels(document) if panel["type"] != "row"]
    assert len({panel["id"] for panel in all_panels(document)}) == len(all_panels(document))
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel["title"]
        assert all(target["datasource"]["uid"] == "${DS_PROMETHEUS}" for target in panel["targets"])
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]


def test_grafana_provisioning_matches_the_compose_services(compose):
    datasource = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    (source,) = datasource["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/gpupool.yml").read_text())["providers"][0]
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./grafana/gpupool.json:{provider['options']['path']}/gpupool.json:ro" in mounts


# --- Prometheus ---------------------------------------------------------------------------------------------


def alert_rules() -> dict[str, dict]:
    groups = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


def test_alert_rules_cover_the_operators_four_alerts_on_exported_metrics(exported):
    document = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    jsonschema.Draft7Validator(json.loads((SCHEMAS / "prometheus.rules.json").read_text())).validate(document)
    rules = alert_rules()
    required = {
        "GpupoolNodeNotReady": "gpupool_node_ready",
        "GpupoolAuditSealingBehind": "gpupool_audit_unwitnessed_seconds",
        "GpupoolQueueWaitHigh": "gpupool_queue_wait_seconds",
        "GpupoolDatabaseDeadlocks": "gpupool_database_deadlocks_total",
    }
    for alert, metric in required.items():
        rule = rules[alert]
        assert metric in rule["expr"], alert
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    for alert in ["GpupoolNodeNotReady", "GpupoolAuditSealingBehind", "GpupoolQueueWaitHigh"]:
        assert re.fullmatch(r"\d+[smh]", rules[alert]["for"]), f"{alert} should wait before firing"
    for alert, rule in rules.items():
        assert_reads_exported(rule["expr"], exported, f"alert {alert}")


def test_prometheus_scrapes_metrics_with_the_bearer_token_and_loads_the_rules(compose):
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jsonschema.Draft7Validator(json.loads((SCHEMAS / "prometheus.json").read_text())).validate(config)
    assert config["rule_files"] == ["alerts.yml"]
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "gpupool" and job["metrics_path"] == "/metrics"
    assert job["authorization"]["type"] == "Bearer"
    secrets = compose["services"]["prometheus"]["secrets"]
    assert {"source": "metrics_token", "target": job["authorization"]["credentials_file"]} in secrets
    assert compose["secrets"]["metrics_token"] == {"environment": "GPUPOOL_METRICS_TOKEN"}


def promtool() -> str | None:
    """promtool on PATH, or where scripts/test_prereqs.py unpacks Debian's (var/tools/promtool)."""
    local = REPO / "var" / "tools" / "promtool"
    return shutil.which("promtool") or (str(local) if local.exists() else None)


def test_promtool_checks_the_rules_the_config_and_the_alert_unit_tests(tmp_path):
    binary = promtool()
    if binary is None:
        pytest.skip("promtool is not installed (scripts/test_prereqs.py unpacks it); the JSON Schemas were checked")
    prometheus_dir = tmp_path / "prometheus"
    shutil.copytree(DEPLOY / "prometheus", prometheus_dir)
    token = tmp_path / "token"
    token.write_text("scrape-secret")
    config = prometheus_dir / "prometheus.yml"
    config.write_text(config.read_text().replace("/etc/prometheus/secrets/gpupool-metrics-token", str(token)))
    for command in (
        ["check", "rules", "alerts.yml"],
        ["check", "config", "prometheus.yml"],
        ["test", "rules", "alerts_test.yml"],
    ):
        answer = subprocess.run([binary, *command], cwd=prometheus_dir, capture_output=True, text=True, timeout=120)
        assert answer.returncode == 0, f"promtool {' '.join(command)}:\n{answer.stdout}\n{answer.stderr}"
    tested = set(re.findall(r"alertname: (\w+)", (DEPLOY / "prometheus" / "alerts_test.yml").read_text()))
    assert {
        "GpupoolNodeNotReady",
        "GpupoolAuditSealingBehind",
        "GpupoolAuditIntegrityFailed",
        "GpupoolQueueWaitHigh",
        "GpupoolDatabaseDeadlocks",
    } <= tested
