"""Each command's --help (issue 26): examples that parse, every option described, the operators' options out of
the users' commands, and --config taken after the subcommand's name too."""
from __future__ import annotations

import shlex
import subprocess

import click
import pytest
from clusterwatch.cli.main import COMMANDS, cli

from tests.support.helpers import CLI, clean_environ

CTX = click.Context(cli)
USER_COMMANDS = ("status", "jobs", "alerts", "health", "diagnose", "record")


def _command(name: str) -> click.Command:
    return cli.get_command(CTX, name)


def _examples(name: str) -> list[str]:
    epilog = _command(name).epilog or ""
    assert epilog.startswith("\b\nExamples:\n"), f"`{name} --help` has no examples"
    return [line.strip() for line in epilog.splitlines()[2:]]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_shows_examples_that_parse(name):
    for line in _examples(name):
        # what the shell would take off (a comment, a redirection, a pipe) before clusterwatch sees it
        words = shlex.split(line.split("  #")[0].split(" > ")[0].split(" | ")[0])
        assert words[:2] == ["clusterwatch", name], line
        args = cli._config_first(CTX, words[1:])
        if args[0] == "--config":  # the group's, read before the command parses
            args = args[2:]
        assert args[0] == name, line
        _command(name).make_context(name, args[1:], parent=CTX)  # click.UsageError where it does not parse


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_shown_is_described(name):
    bare = [p.opts[-1] for p in _command(name).params
            if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip()]
    assert bare == [], f"`clusterwatch {name} --help` does not say what {bare} do"


@pytest.mark.parametrize("name", USER_COMMANDS)
def test_operator_options_stay_out_of_the_users_help_but_work(name):
    options = {o for p in _command(name).params if isinstance(p, click.Option) and not p.hidden for o in p.opts}
    assert "--collectors-before" not in options
    assert "--collectors-before" in {o for p in _command(name).params for o in p.opts}  # still taken
    for operator in ("agent", "collector"):
        assert "--collectors-before" in {o for p in _command(operator).params if not p.hidden for o in p.opts}


@pytest.mark.parametrize("where", [["jobs", "--config", "{file}"], ["jobs", "--config={file}", "--all"],
                                   ["--config", "{file}", "jobs"]])
def test_config_is_taken_before_or_after_the_subcommand(tmp_path, where):
    config = tmp_path / "site.toml"
    config.write_text(f'[cli]\ncollector = "unix:{tmp_path}/no-collector.sock"\n')
    args = [a.format(file=config) for a in where]
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, env=clean_environ())
    assert done.returncode == 1, done.stderr
    assert f"the collector at unix:{tmp_path}/no-collector.sock does not answer" in done.stderr, done.stderr


def test_a_config_after_run_s_command_is_the_command_s():
    args = cli._config_first(CTX, ["run", "--interval", "1", "python", "train.py", "--config", "x.yaml"])
    assert args == ["run", "--interval", "1", "python", "train.py", "--config", "x.yaml"]
    assert cli._config_first(CTX, ["run", "--config", "c.toml", "--", "python", "--config", "x.yaml"]) == \
        ["--config", "c.toml", "run", "--", "python", "--config", "x.yaml"]
