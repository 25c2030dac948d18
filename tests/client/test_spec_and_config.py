"""Job specs from command-line options, the saved login, and shell completion (no server needed)."""

from __future__ import annotations

import os
import stat

import pytest
from click.testing import CliRunner

from gpupool_client import ConfigError
from gpupool_client.cli import cli
from gpupool_client.config import load_settings, save_login
from gpupool_client.spec import SpecError, build_spec, parse_array, parse_size_mib


@pytest.mark.parametrize(
    ("text", "mib"), [("8Gi", 8192), ("512Mi", 512), ("4096", 4096), ("1.5Gi", 1536), ("2G", 1908), ("1Ti", 1048576)]
)
def test_sizes_are_read_as_kubernetes_writes_them(text, mib):
    assert parse_size_mib(text) == mib


def test_an_array_range_gives_the_number_of_jobs():
    assert parse_array("0-99") == 100
    with pytest.raises(SpecError, match="range from 0"):
        parse_array("1-10")


def test_options_override_a_file_spec_and_whole_cards_give_way_to_a_fraction():
    base = {"name": "f", "resources": {"flavors": ["a"], "gpus": 2}, "command": ["x"], "env": {"A": "1"}}
    spec = build_spec(base=base, fraction=0.3, memory="8Gi", env=["B=2"], priority="high", mem="64Gi", cpus=8)
    assert spec["resources"] == {
        "flavors": ["a"],
        "millis": 300,
        "memory_mib": 8192,
        "cpu_cores": 8,
        "host_memory_mib": 65536,
    }
    assert spec["env"] == {"A": "1", "B": "2"} and spec["priority_class"] == "high"
    assert base["resources"] == {"flavors": ["a"], "gpus": 2}  # the caller's dict is left alone


def test_any_flavor_marks_the_flavors_as_alternatives():
    spec = build_spec(command=["x"], gpus=1, flavors=["a", "b"], any_flavor=True)
    assert spec["resources"] == {"flavors": ["a", "b"], "any_flavor": True, "gpus": 1}
    assert "any_flavor" not in build_spec(command=["x"], gpus=1, flavors=["a", "b"])["resources"]


def test_a_spec_without_a_command_or_cards_says_how_to_give_them():
    with pytest.raises(SpecError, match="put the command after --"):
        build_spec(gpus=1)
    with pytest.raises(SpecError, match="--gpus N, or --fraction"):
        build_spec(command=["python", "train.py"])
    assert build_spec(command=["python", "/src/train.py", "--lr", "1"], gpus=1)["name"] == "train"


def test_the_saved_login_is_private_and_the_environment_overrides_it(tmp_path):
    environ = {"GPUPOOL_CONFIG": str(tmp_path / "gpupool" / "cli.json")}
    path = save_login(url="https://pool.example.com/", token="gp_a_b", environ=environ)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    saved = load_settings(environ=environ)
    assert (saved.url, saved.token) == ("https://pool.example.com", "gp_a_b")
    overridden = load_settings(environ={**environ, "GPUPOOL_TOKEN": "gp_c_d", "GPUPOOL_TIMEOUT": "5"})
    assert (overridden.token, overridden.timeout_s) == ("gp_c_d", 5.0)
    with pytest.raises(ConfigError, match="gpupool-cli login"):
        load_settings(environ={"GPUPOOL_CONFIG": str(tmp_path / "none.json")})
    # The saved token is never sent to another server.
    with pytest.raises(ConfigError, match=r"no API token for https://other\.example\.com"):
        load_settings(url="https://other.example.com", environ=environ)


@pytest.mark.parametrize(("shell", "marker"), [("bash", "complete -o nosort -F"), ("zsh", "compdef")])
def test_completion_scripts_for_bash_and_zsh(shell, marker):
    result = CliRunner().invoke(cli, ["completion", shell])
    assert result.exit_code == 0
    assert marker in result.stdout and "_GPUPOOL_CLI_COMPLETE" in result.stdout


def test_completion_offers_the_commands():
    env = {"_GPUPOOL_CLI_COMPLETE": "bash_complete", "COMP_WORDS": "gpupool-cli su", "COMP_CWORD": "1"}
    result = CliRunner().invoke(cli, [], prog_name="gpupool-cli", env=env)
    assert "submit" in result.stdout


def test_a_fraction_is_a_tenth_of_a_card_at_least_in_hundredths():
    from gpupool_client.spec import fraction_millis

    assert fraction_millis(0.47) == 470
    assert fraction_millis(0.99) == 990
    for bad in (0.05, 0.475, 1.0):
        with pytest.raises(SpecError, match=r"between 0\.1 and 0\.99"):
            fraction_millis(bad)
