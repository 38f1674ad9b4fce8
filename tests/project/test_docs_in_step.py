"""The docs say what the code does: checked against the code itself, so they cannot drift apart."""
from __future__ import annotations

import click
from clusterwatch.cli.main import cli as cli_group

from tests.support.helpers import ROOT


def _envvars(name: str) -> set[str]:
    command = cli_group.get_command(click.Context(cli_group), name)
    return {p.envvar for p in command.params if isinstance(p.envvar, str) and p.envvar.startswith("CLUSTERWATCH_")}


def test_the_configuration_reference_names_every_variable_of_every_command():
    text = (ROOT / "docs" / "configuration.md").read_text()
    table = text.split("The variables of the flags (`--help` shows the flags, not these names):", 1)[1]
    table = table.lstrip().split("\n\n", 1)[0]
    for name in cli_group.list_commands(click.Context(cli_group)):
        missing = sorted(v for v in _envvars(name) if f"`{v}`" not in table)
        assert not missing, f"docs/configuration.md's table of variables lacks {missing} ({name})"
