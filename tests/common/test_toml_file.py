"""The one TOML reader: every problem is one ConfigError line naming the file, the line and what to do."""
from __future__ import annotations

from pathlib import Path

import pytest

from clusterwatch import toml_file
from clusterwatch.errors import ConfigError
from clusterwatch.toml_schema import Key, Number, Table

SCHEMA = Table({"a": Key("a", Table({"n": Key("n", Number())}))})


def message(call, *args) -> str:
    with pytest.raises(ConfigError) as err:
        call(*args)
    text = str(err.value)
    assert "\n" not in text
    return text


def test_a_file_that_is_not_toml_names_its_line() -> None:
    assert message(toml_file.parse, "x = 1\n[a\n", "f.toml") == (
        "f.toml: line 2: not valid TOML: Expected ']' at the end of a table declaration")


def test_a_wrong_value_names_its_line_and_table() -> None:
    assert toml_file.load("[a]\nn = 2\n", "f.toml", SCHEMA) == {"a": {"n": 2.0}}
    assert message(toml_file.load, "# top\n[a]\nn = -1\n", "f.toml", SCHEMA) == (
        "f.toml: line 3: [a] n must not be negative")
    assert message(toml_file.load, "b = 1\n", "f.toml", SCHEMA) == "f.toml: line 1: unknown key 'b' (known: a)"


def test_an_unreadable_file_says_why_and_what_to_do(tmp_path: Path) -> None:
    assert message(toml_file.read_text, tmp_path / "none.toml", "thing x", "fix --x") == (
        "thing x: cannot read it (No such file or directory); fix --x")
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b'name = "caf\xe9"\n')
    assert message(toml_file.read_text, latin, "thing x", "fix --x").startswith(
        "thing x: cannot read it (not UTF-8 text: invalid continuation byte at byte 11)")
