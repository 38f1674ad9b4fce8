"""Where an option's value came from, said as the user gave it: a message about a value from the config file
names the file and its key, one from the environment its variable, not a flag the user never typed."""
from __future__ import annotations

import click
from click.core import ParameterSource

CONFIG_FILE = "clusterwatch.config_file"  # ctx.meta: the config file read (cli/main.py), or None


def given_as(ctx: click.Context | None, param: click.Parameter | str, flag: str | None = None) -> str:
    """`--db`, `CLUSTERWATCH_DB` or `config file /etc/clusterwatch/config.toml: [collector] db_path`.

    Args:
        ctx: the command's context (None: the flag).
        param: the parameter, or its name.
        flag: how to say it when given on the command line (default: the parameter's first long option).
    """
    name = param if isinstance(param, str) else param.name
    if isinstance(param, str) and ctx is not None:
        param = next((p for p in ctx.command.params if p.name == name), param)
    if flag is None:
        flag = next((o for o in getattr(param, "opts", ()) if o.startswith("--")), f"--{name.replace('_', '-')}")
    source = ctx.get_parameter_source(name) if ctx is not None else None
    if source is ParameterSource.DEFAULT_MAP:
        from clusterwatch.config import SECTIONS

        section = next((s for s, commands in SECTIONS.items() if ctx.info_name in commands), ctx.info_name)
        return f"config file {ctx.meta.get(CONFIG_FILE) or '?'}: [{section}] {name}"
    if source is ParameterSource.ENVIRONMENT:
        envvar = getattr(param, "envvar", None)
        return envvar if isinstance(envvar, str) else flag
    return flag
