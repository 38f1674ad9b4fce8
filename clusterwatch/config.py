"""The optional TOML config file shared by every command.

Looked up from `--config`, then `$CLUSTERWATCH_CONFIG`, then /etc/clusterwatch/config.toml
when it exists. Sections: [agent], [collector], and [cli] (for status, jobs, alerts,
record). Keys are the long option names with underscores, e.g.

    [cli]
    collector = "collector.example.org:50051"

Precedence, highest first: the command-line flag, its CLUSTERWATCH_* variable, the file,
the built-in default.

Every user reads the file (the [cli] section is theirs), so it holds no secret: the agents' token goes in a
token file only root (on the collector host: the collector's user) may read, named by `token_file`. A file
that holds a `token` and that group or others may read is refused (load_default_map).

The deployment's collectors are one top-level list, read by every [cli] command (clusterwatch/shards.py):

    collectors = ["c1:50051", "c2:50051", "c3:50051"]
    collectors_before = { job = 4242, collectors = ["c1:50051", "c2:50051"] }   # while older jobs run
"""
from __future__ import annotations

import os

from .errors import ConfigError

SYSTEM_CONFIG = "/etc/clusterwatch/config.toml"
# [cli]: the commands that ask a collector (each takes --collector, --collectors-before and --tls-ca)
SECTIONS = {"agent": ("agent",), "collector": ("collector",),
            "cli": ("status", "jobs", "alerts", "record", "health", "diagnose"),
            # [prolog]: the hook's own settings (the health gate); where to find the agent it takes from [agent]
            "prolog": ("prolog",)}
# Top-level keys: the collectors list, in the one order every host uses
TOP_LEVEL = ("collectors", "collectors_before")


# Keys whose value is a secret: a config file readable by others must not hold them.
SECRET_KEYS = ("token",)


def read_token_file(path: str) -> str:
    """The token in `path` (its first line): a file only its owner, this user or root, may read or change.

    Raises:
        ConfigError: the file is missing, open to group or others, owned by someone else, or holds no token;
            the message says what to do.
    """
    from .secret_file import read_secret_file

    return read_secret_file(path, f"token file {path}", "the agents' token").decode()


def _refuse_readable_secret(found: str, doc: dict) -> None:
    """ConfigError when a file group or others may read holds a secret key (SECRET_KEYS)."""
    held = sorted(f"[{section}] {key}" for section, values in doc.items() if isinstance(values, dict)
                  for key in values if key.replace("-", "_") in SECRET_KEYS)
    if not held:
        return
    try:
        mode = os.stat(found).st_mode
    except OSError:
        return
    if mode & 0o044:
        raise ConfigError(f"config file {found} holds {', '.join(held)} and other users may read it "
                          f"(mode {mode & 0o777:04o}): move the token into a token file only root may read "
                          "(install -m 0600 /dev/stdin /etc/clusterwatch/token; token_file = "
                          '"/etc/clusterwatch/token" in the file), or chmod 600 the file')


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
    from . import toml_file  # imported only when there is a file: every command reads this

    label = f"config file {found}"
    if not os.path.exists(found):
        raise ConfigError(f"{label} does not exist; fix --config or CLUSTERWATCH_CONFIG")
    doc = toml_file.parse(toml_file.read_text(found, label, "fix --config or CLUSTERWATCH_CONFIG"), label)
    _refuse_readable_secret(found, doc)
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
