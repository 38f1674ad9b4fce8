"""The optional TOML config file shared by every command.

Looked up from `--config`, then `$CLUSTERWATCH_CONFIG`, then /etc/clusterwatch/config.toml
when it exists. Sections: [agent], [collector], and [cli] (for status, jobs, alerts,
record). Keys are the long option names with underscores, e.g.

    [cli]
    collector = "collector.example.org:50051"

Precedence, highest first: the command-line flag, its CLUSTERWATCH_* variable, the file,
the built-in default.

The deployment's collectors are one top-level list, read by every [cli] command (clusterwatch/shards.py):

    collectors = ["c1:50051", "c2:50051", "c3:50051"]
    collectors_before = { job = 4242, collectors = ["c1:50051", "c2:50051"] }   # while older jobs run
"""
from __future__ import annotations

import os
import sys

from .errors import ConfigError

SYSTEM_CONFIG = "/etc/clusterwatch/config.toml"
# [cli]: the commands that ask a collector (each takes --collector, --collectors-before and --tls-ca)
SECTIONS = {"agent": ("agent",), "collector": ("collector",),
            "cli": ("status", "jobs", "alerts", "record", "health", "diagnose")}
# Top-level keys: the collectors list, in the one order every host uses
TOP_LEVEL = ("collectors", "collectors_before")


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
    unknown = set(doc) - set(SECTIONS) - set(TOP_LEVEL)
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
    for cmd, values in collectors_defaults(doc, found).items():
        for key, value in values.items():
            out.setdefault(cmd, {}).setdefault(key, value)  # a [cli] collector = ... of its own wins
    return out


def collectors_defaults(doc: dict, found: str) -> dict[str, dict]:
    """The top-level `collectors` (and `collectors_before`) as the [cli] commands' --collector defaults."""
    from .shards import ShardError, parse_list

    if "collectors" not in doc:
        if "collectors_before" in doc:
            raise ConfigError(f"config file {found}: collectors_before without collectors; give the current list")
        return {}
    try:
        values = {"collector": ",".join(parse_list(_strings(doc["collectors"], "collectors", found),
                                                   f"config file {found}: collectors"))}
        before = doc.get("collectors_before")
        if before is not None:
            if not isinstance(before, dict) or set(before) != {"job", "collectors"} or \
                    not isinstance(before["job"], int) or isinstance(before["job"], bool) or before["job"] < 1:
                raise ConfigError(f"config file {found}: collectors_before must be {{ job = N, collectors = "
                                  "[...] }}: the first job number of `collectors`, and the list before it")
            members = parse_list(_strings(before["collectors"], "collectors_before", found),
                                 f"config file {found}: collectors_before")
            values["collectors_before"] = f"{before['job']}={','.join(members)}"
    except ShardError as exc:
        raise ConfigError(str(exc)) from None
    out = {cmd: dict(values) for cmd in SECTIONS["cli"]}
    # the agent streams to each collector it has data for (agent/shard_streams.py)
    out["agent"] = dict(values)
    # the collector takes the list to know its own jobs (--shard, its entry in it, is its own setting)
    out["collector"] = {"collectors": values["collector"], **({"collectors_before": values["collectors_before"]}
                                                               if "collectors_before" in values else {})}
    return out


def _strings(value, key: str, found: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f'config file {found}: {key} must be a list of "HOST:PORT" strings')
    return value
