"""Reading clusterwatch's TOML files (rules, XID catalog, sim scenario, config): one error form.

Every problem is one `ConfigError` line that starts with the file's label ("scenario x.toml",
"XID catalog x.toml", or the bare path), then the line where it can be told, then what is wrong:

    rules.toml: line 3: [gpu_stall] for_s must not be negative
    scenario x.toml: line 1: not valid TOML: Expected ']' at the end of a table declaration

What a file may hold is declared with `toml_schema` (Table, Key, values), or checked by the
reader itself, which raises `Invalid` with the table's path so the line can be found here.
tomllib and toml_schema are imported on first use: every CLI command may read the config file, and
they cost ~1.5 ms and ~5 ms (toml_schema's dataclasses) where the config file needs neither.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ConfigError

if TYPE_CHECKING:
    from .toml_schema import Invalid, Table

__all__ = ["read_text", "parse", "load", "at_line", "error_at"]

# where tomllib puts the line in its message (compiled on the first error: start-up pays nothing)
_TOML_LINE = r" \(at line (\d+), column \d+\)"


def read_text(path: str | Path, label: str, hint: str) -> str:
    """The text of a TOML file (UTF-8, as TOML is).

    Args:
        path: The file.
        label: How errors name it ("XID catalog /etc/x.toml").
        hint: What to do when it cannot be read ("fix the path or drop the option").

    Raises:
        ConfigError: `{label}: cannot read it ({why}); {hint}`.
    """
    try:
        return Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        why = exc.strerror or str(exc)
    except UnicodeDecodeError as exc:
        why = f"not UTF-8 text: {exc.reason} at byte {exc.start}"
    raise ConfigError(f"{label}: cannot read it ({why}); {hint}") from None


def parse(text: str, label: str) -> dict[str, Any]:
    """TOML text as a dict.

    Raises:
        ConfigError: `{label}: line N: not valid TOML: {what}`.
    """
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = re.search(_TOML_LINE, msg)
        where = f"{label}: line {m.group(1)}" if m else label
        raise ConfigError(f"{where}: not valid TOML: {re.sub(_TOML_LINE, '', msg)}") from None


def at_line(label: str, text: str, path: tuple[str | int, ...] = (), key: str | None = None) -> str:
    """`{label}: line N` for a key (or its table) of the file's text; the bare label where it cannot be told."""
    from .toml_schema import Invalid

    line = Invalid("", path, key).locate(text)
    return f"{label}: line {line}" if line else label


def error_at(label: str, text: str, exc: Invalid) -> ConfigError:
    """The ConfigError for an Invalid: `{label}: line N: [table] what` (no table at the top level)."""
    table = f"[{exc.where}] " if exc.path else ""
    return ConfigError(f"{at_line(label, text, exc.path, exc.key)}: {table}{exc.what}")


def load(text: str, label: str, schema: Table) -> Any:
    """Parse TOML text and read it with `schema`: what the schema's table builds.

    Raises:
        ConfigError: the text is not TOML, or a key or value is wrong (see `parse`, `error_at`).
    """
    from .toml_schema import Invalid

    data = parse(text, label)
    try:
        return schema.read(data)
    except Invalid as exc:
        raise error_at(label, text, exc) from None
