"""A small typed schema for TOML files: which keys each table takes and what each value must be.

A `Table` maps file keys to `Key`s (the field a key sets and the `Value` it must be); its
`read` checks a parsed table and returns the converted fields in file order, or raises
`Invalid` naming the table's path, the key and what is allowed. `Invalid.locate` finds the
key's line in the file's text, so the caller can say file and line (toml_file.py does). What
each file holds lives with its reader (collector/rules/config.py declares the rules file);
nothing here knows one file.
"""
from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, get_type_hints

#: A table's place in the file: table names, and 1-based entry numbers for arrays of tables.
Path = tuple[str | int, ...]


class Invalid(Exception):
    """A value or table of the file is wrong.

    Attributes:
        what: What is wrong and what is allowed, one line.
        path: The table it is in.
        key: The file key it is about, None when about the whole table.
    """

    def __init__(self, what: str, path: Path = (), key: str | None = None) -> None:
        super().__init__(what)
        self.what, self.path, self.key = what, path, key

    @property
    def where(self) -> str:
        """The table as a person reads it: "actions.steps #2", "overrides #1.gpu_stall"."""
        return path_text(self.path)

    def locate(self, text: str) -> int | None:
        """1-based line of the key (or of its table) in `text`, None where it cannot be told."""
        return _line_of(text, self.path, self.key)


def path_text(path: Path) -> str:
    """A path as a person reads it: names joined by dots, entry numbers as " #n"."""
    out = ""
    for part in path:
        out += f" #{part}" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def is_number(x: Any) -> bool:
    """An int or float, not a bool (TOML's true is no number)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


# ---- values: each checks one file value and converts it ----------------------------------------

class Value(ABC):
    """What one file value must be. `check` returns the converted value or raises ValueError
    with the phrase that follows the key ("must be a number, not 'x'")."""

    @abstractmethod
    def check(self, value: Any) -> Any: ...


@dataclass(frozen=True)
class Bool(Value):
    def check(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise ValueError(f"must be true or false, not {value!r}")
        return value


@dataclass(frozen=True)
class Text(Value):
    """A string, one of `choices` where given."""

    choices: tuple[str, ...] = ()

    def check(self, value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError(f"must be a string, not {value!r}")
        if self.choices and value not in self.choices:
            raise ValueError(f"must be one of {', '.join(self.choices)}, not {value!r}")
        return value


@dataclass(frozen=True)
class Number(Value):
    """A number, not negative, times `scale` (file units to base units: MB to bytes).

    With `integer`, the value is cut to an int and raised to at least `at_least`.
    """

    scale: float = 1.0
    integer: bool = False
    at_least: int = 0

    def check(self, value: Any) -> float | int:
        if not is_number(value) or math.isnan(value):
            raise ValueError(f"must be a number, not {value!r}")
        if value < 0:
            raise ValueError("must not be negative")
        if self.integer:
            if math.isinf(value):  # int() of it would raise OverflowError, not a line saying what is wrong
                raise ValueError(f"must be a whole number, not {value!r}")
            return max(self.at_least, int(value))
        return float(value) * self.scale


@dataclass(frozen=True)
class Strings(Value):
    """A list of strings, each one of `choices` where given, at least one with `non_empty`."""

    expects: str
    choices: tuple[str, ...] = ()
    choices_name: str = ""
    non_empty: bool = False

    def check(self, value: Any) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or (
                self.non_empty and not value):
            raise ValueError(f"must be {self.expects}")
        for v in value:
            if self.choices and v not in self.choices:
                raise ValueError(f"holds unknown {self.choices_name} {v!r} "
                                 f"({self.choices_name}s: {', '.join(self.choices)})")
        return tuple(value)


@dataclass(frozen=True)
class Converted(Value):
    """A value checked and converted by a function that raises ValueError with the phrase."""

    convert: Callable[[Any], Any]

    def check(self, value: Any) -> Any:
        return self.convert(value)


@dataclass(frozen=True)
class Key:
    """One key of a table.

    Attributes:
        field: Name the converted value is returned under (a dataclass field).
        value: What the file value must be.
        needs: Where the key is required, the example the error shows (`needs rules = [...]`).
    """

    field: str
    value: Value | Table | ArrayOf
    needs: str = ""


@dataclass(frozen=True)
class Table:
    """A table: its keys, checks across keys, and what is built from the converted fields.

    Attributes:
        keys: File key → Key, in the order the documentation gives them.
        build: Turns the converted fields (a dict in file order) into the result.
        checks: Run on the converted fields; each raises Invalid(what, key=...) with path ().
        noun: What an unknown key is called in errors ("key"; "table" at a file's top level).
    """

    keys: Mapping[str, Key]
    build: Callable[[dict[str, Any]], Any] = dict
    checks: tuple[Callable[[dict[str, Any]], None], ...] = ()
    noun: str = "key"

    def read(self, raw: Mapping[str, Any], path: Path = ()) -> Any:
        """Check a parsed table and build its result; raises Invalid."""
        out: dict[str, Any] = {}
        for name, value in raw.items():
            key = self.keys.get(name)
            if key is None:
                raise Invalid(f"unknown {self.noun} {name!r} (known: {', '.join(sorted(self.keys))})",
                              path, name)
            if isinstance(key.value, (Table, ArrayOf)):
                out[key.field] = key.value.check_at(value, (*path, name))
                continue
            try:
                out[key.field] = key.value.check(value)
            except ValueError as exc:
                raise Invalid(f"{name} {exc}", path, name) from None
        for name, key in self.keys.items():
            if key.needs and name not in raw:
                raise Invalid(f"needs {name} = {key.needs}", path)
        for check in self.checks:
            try:
                check(out)
            except Invalid as exc:
                raise Invalid(exc.what, path, exc.key) from None
        return self.build(out)

    def check_at(self, value: Any, path: Path) -> Any:
        """A table under a key: a TOML table first, then read."""
        if not isinstance(value, dict):
            raise Invalid(f"{path[-1]} must be a table ([{path_text(path)}])", path[:-1], str(path[-1]))
        return self.read(value, path)


@dataclass(frozen=True)
class ArrayOf:
    """An array of tables ([[name]]), each read by `table`; the result is a tuple."""

    table: Table

    def check_at(self, value: Any, path: Path) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise Invalid(f"{path[-1]} must be an array of tables ([[{path_text(path)}]])",
                          path[:-1], str(path[-1]))
        out = []
        for i, entry in enumerate(value, 1):
            if not isinstance(entry, dict):
                raise Invalid("must be a table", (*path, i))
            out.append(self.table.read(entry, (*path, i)))
        return tuple(out)


def keys_of(cls: type, values: Mapping[str, Value] | None = None,
            renamed: Mapping[str, tuple[str, Value]] | None = None) -> dict[str, Key]:
    """Keys for a dataclass's fields, each checked as its type says (bool, str, float, int).

    Args:
        cls: The dataclass.
        values: Field → Value for fields whose type says too little (choices, lists).
        renamed: Field → (file key, Value) for fields the file names in its own units
            (min_rate_per_h is min_rate_mb_per_h in MB).

    Raises:
        TypeError: A field's type has no plain check and no Value is given (a programming error).
    """
    values, renamed = values or {}, renamed or {}
    hints = get_type_hints(cls)
    plain: dict[Any, Value] = {bool: Bool(), str: Text(), float: Number(), int: Number(integer=True)}
    out: dict[str, Key] = {}
    for f in fields(cls):
        if f.name in renamed:
            file_key, value = renamed[f.name]
        elif f.name in values:
            file_key, value = f.name, values[f.name]
        elif hints[f.name] in plain:
            file_key, value = f.name, plain[hints[f.name]]
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: no check for {hints[f.name]!r}")
        out[file_key] = Key(f.name, value)
    return out


# ---- finding the line ---------------------------------------------------------------------------

_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\[\]]+?)\s*\]\]?\s*(?:#.*)?$")


def _header_parts(text: str) -> list[str]:
    return [p.strip().strip("\"'") for p in text.split(".")]


def _sections(lines: list[str]) -> list[Path]:
    """The table path each line belongs to (entries of arrays of tables numbered from 1)."""
    counts: dict[tuple[str, ...], int] = {}
    current: Path = ()
    out = []
    for line in lines:
        m = _HEADER.match(line)
        if m:
            names = _header_parts(m.group(2))
            path: list[str | int] = []
            for i, name in enumerate(names):
                path.append(name)
                prefix = tuple(names[:i + 1])
                if m.group(1) == "[[" and i == len(names) - 1:
                    counts[prefix] = counts.get(prefix, 0) + 1
                if prefix in counts:
                    path.append(counts[prefix])
            current = tuple(path)
        out.append(current)
    return out


def _line_of(text: str, path: Path, key: str | None) -> int | None:
    lines = text.splitlines()
    sections = _sections(lines)

    def key_line(where: Path, name: str) -> int | None:
        pat = re.compile(r"^\s*" + re.escape(name) + r"\s*[=.]")
        for i, line in enumerate(lines):
            if sections[i] == where and pat.match(line):
                return i + 1
        return None

    def header_line(where: Path) -> int | None:
        for i, line in enumerate(lines):
            if sections[i] == where and _HEADER.match(line):
                return i + 1
        return None

    if key is not None and (line := key_line(path, key) or header_line((*path, key))):
        return line
    # Not in its own section (an inline table, dotted keys): the line that opens it.
    for cut in range(len(path), 0, -1):
        if (line := header_line(path[:cut])):
            return line
        parent, name = path[:cut - 1], path[cut - 1]
        while parent and isinstance(name, int):
            parent, name = parent[:-1], parent[-1]
        if isinstance(name, str) and (line := key_line(parent, name)):
            return line
    return None
