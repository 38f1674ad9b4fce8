"""The shared TOML config file: where it is found, what it sets, and one line when it is wrong."""
from __future__ import annotations

from pathlib import Path

import pytest

from clusterwatch.config import load_default_map
from clusterwatch.errors import ConfigError
from tests.services.procs import free_port
from tests.support.helpers import cli


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_sections_become_each_commands_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, '[cli]\ncollector = "cw.example.org:50051"\n[agent]\ninterval = 2.5\n'
                           'send-interval = 10\n[collector]\nhistory_points = 100\n')
    got = load_default_map(str(path))
    for cmd in ("status", "jobs", "alerts", "record", "health", "diagnose"):
        assert got[cmd] == {"collector": "cw.example.org:50051"}
    assert got["agent"] == {"interval": 2.5, "send_interval": 10}  # dashes as click's parameter names
    assert got["collector"] == {"history_points": 100}


def test_the_environment_names_the_file_when_no_flag_does(tmp_path: Path, monkeypatch) -> None:
    path = write(tmp_path, '[cli]\ncollector = "from-env:1"\n')
    monkeypatch.setenv("CLUSTERWATCH_CONFIG", str(path))
    assert load_default_map(None)["status"] == {"collector": "from-env:1"}
    other = tmp_path / "other.toml"
    other.write_text('[cli]\ncollector = "from-flag:2"\n')
    assert load_default_map(str(other))["status"] == {"collector": "from-flag:2"}


@pytest.mark.parametrize("text, says", [
    ("[cli\ncollector = 1\n", "line 1: not valid TOML"),
    ("[clie]\ncollector = 'x'\n", "unknown section(s) clie; expected agent, collector, cli"),
    ("cli = 3\n", "[cli] must be a table"),
])
def test_a_bad_file_is_one_clear_error(tmp_path: Path, text: str, says: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_default_map(str(path))
    assert says in str(err.value) and str(path) in str(err.value)
    assert "\n" not in str(err.value)


def test_a_missing_file_says_how_it_was_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist; fix --config or CLUSTERWATCH_CONFIG"):
        load_default_map(str(tmp_path / "nope.toml"))


def test_status_takes_the_collector_from_the_file_below_the_environment(tmp_path: Path) -> None:
    from_file, from_env = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    path = write(tmp_path, f'[cli]\ncollector = "{from_file}"\n')
    env = {"CLUSTERWATCH_CONFIG": str(path), "CLUSTERWATCH_COLLECTOR": ""}
    proc = cli("status", "42", env=env)
    assert proc.returncode == 1 and f"the collector at {from_file} does not answer" in proc.stderr, proc.stderr
    proc = cli("status", "42", env={**env, "CLUSTERWATCH_COLLECTOR": from_env})
    assert proc.returncode == 1 and f"the collector at {from_env} does not answer" in proc.stderr, proc.stderr


def test_a_broken_file_stops_a_command_with_one_line_but_never_a_hook(tmp_path: Path) -> None:
    path = write(tmp_path, "[cli\n")
    proc = cli("--config", str(path), "status", "42")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert any("line 1: not valid TOML" in line for line in lines) and "Traceback" not in proc.stderr
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_UID": "0", "SLURMD_NODENAME": "cfg1", "SLURM_JOB_EXIT_CODE2": "0:0",
           "SLURM_SCRIPT_CONTEXT": "epilog_slurmd", "CLUSTERWATCH_SPOOL": str(tmp_path / "spool"),
           "CLUSTERWATCH_COLLECTOR": f"127.0.0.1:{free_port()}", "CLUSTERWATCH_GPU_SOURCE": "none"}
    proc = cli("--config", str(path), "epilog", env=env)
    assert proc.returncode == 0
    assert "the hook goes on with defaults" in proc.stderr


def test_every_command_that_asks_a_collector_takes_the_cli_section() -> None:
    # a command that asks a collector and is missing from [cli] would ignore the file's collectors list
    import click
    from clusterwatch.cli.main import COMMANDS
    from clusterwatch.cli.main import cli as group

    from clusterwatch.config import SECTIONS

    ctx = click.Context(group)
    asking = {name for name in COMMANDS
              if any(p.name == "tls_ca" for p in group.get_command(ctx, name).params) and name != "agent"}
    assert asking == set(SECTIONS["cli"])
