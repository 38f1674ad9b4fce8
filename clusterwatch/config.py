"""The optional TOML config file shared by every command.

Looked up from `--config`, then `$CLUSTERWATCH_CONFIG`, then /etc/clusterwatch/config.toml
when it exists. Sections: [agent], [collector], and [cli] (for status, jobs, alerts,
record). Keys are the long option names with underscores, e.g.

    [cli]
    collector = "collector.example.org:50051"

Precedence, highest first: the command-line flag, its CLUSTERWATCH_* variable, the file,
the built-in default.
"""
from __future__ import annotations

import os
import sys

from .errors import ConfigError

SYSTEM_CONFIG = "/etc/clusterwatch/config.toml"
SECTIONS = {"agent": ("agent",), "collector": ("collector",), "cli": ("status", "jobs", "alerts", "record")}


def find_config(path: str | None) -> str | None:
    """The config file to read, or None when there is none."""
    if path:
        return path
    env = os.environ.get("CLUSTERWATCH_CONFIG")
    if env:
        return env
    return SYSTEM_CONFIG if os.path.exists(SYSTEM_CONFIG) else None


def load_default_map(path: str | None) -> dict[str, dict]:
    """Read the file into click's default_map shape: command name → {option: value}."""
    found = find_config(path)
    if found is None:
        return {}
    # imported only when there is a file: every command reads this, and tomllib costs ~4 ms
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        with open(found, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {found} does not exist; fix --config or CLUSTERWATCH_CONFIG") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {found} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {found}: {exc.strerror}") from None
    unknown = set(doc) - set(SECTIONS)
    if unknown:
        raise ConfigError(f"config file {found}: unknown section(s) {', '.join(sorted(unknown))}; "
                          f"expected {', '.join(SECTIONS)}")
    out: dict[str, dict] = {}
    for section, commands in SECTIONS.items():
        values = doc.get(section, {})
        if not isinstance(values, dict):
            raise ConfigError(f"config file {found}: [{section}] must be a table")
        for cmd in commands:
            out[cmd] = {k.replace("-", "_"): v for k, v in values.items()}
    return out
