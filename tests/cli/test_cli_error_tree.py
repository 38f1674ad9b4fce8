"""The console script says any ClusterwatchError a command let through as one line, never a traceback:
exit 2 for a ConfigError (the user's input), 1 for the rest; other exceptions still show their traceback."""
from __future__ import annotations

import sys

import click
import pytest
from clusterwatch.cli import main as cli_main
from clusterwatch.collector.health.xid_catalog import CatalogError

from clusterwatch import config
from clusterwatch.errors import ClusterwatchError, CollectorUnreachable, ConfigError


def run_raising(monkeypatch, exc: BaseException) -> None:
    @click.command()
    def boom() -> None:
        raise exc

    monkeypatch.setattr(cli_main.LazyGroup, "get_command", lambda self, ctx, name: boom if name == "boom" else None)
    monkeypatch.setattr(sys, "argv", ["clusterwatch", "boom"])
    monkeypatch.setenv("CLUSTERWATCH_CONFIG", "")
    monkeypatch.setattr(config, "SYSTEM_CONFIG", "/nonexistent/clusterwatch.toml")
    cli_main.main()


@pytest.mark.parametrize("exc, code", [
    (ConfigError("config file x.toml: line 3: not valid TOML: Expected ']'"), 2),
    (CatalogError("XID catalog x.toml: line 2: [xid.13] severity must be one of info, warning, critical, "
                  "not 'fatal'"), 2),
    (CollectorUnreachable("the collector at c1:50051 does not answer"), 1),
    (ClusterwatchError("something a person can act on"), 1),
])
def test_an_error_of_the_tree_is_one_line(monkeypatch, capsys, exc: ClusterwatchError, code: int) -> None:
    with pytest.raises(SystemExit) as done:
        run_raising(monkeypatch, exc)
    assert done.value.code == code
    assert capsys.readouterr().err == f"clusterwatch: {exc}\n"


def test_any_other_exception_is_a_bug_and_keeps_its_traceback(monkeypatch) -> None:
    with pytest.raises(KeyError):
        run_raising(monkeypatch, KeyError("a bug"))
