"""The `clusterwatch` command: a click group whose subcommands load on first use.

Subcommands are imported lazily so that a quick command (`status` on a login node,
`prolog` on a compute node) does not pay for grpc.aio servers, psutil or
prometheus_client it never uses.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys

import click

from clusterwatch.errors import ClusterwatchError, ConfigError

# name → "module:attribute" of a click command
COMMANDS: dict[str, str] = {
    "agent": "clusterwatch.cli.agent_cmd:agent",
    "collector": "clusterwatch.cli.collector_cmd:collector",
    "status": "clusterwatch.cli.status_cmd:status",
    "jobs": "clusterwatch.cli.status_cmd:jobs",
    "run": "clusterwatch.cli.run_cmd:run",
    "demo": "clusterwatch.cli.demo_cmd:demo",
    "replay": "clusterwatch.cli.replay_cmd:replay",
    "record": "clusterwatch.cli.record_cmd:record",
    "alerts": "clusterwatch.cli.alerts_cmd:alerts",
    "health": "clusterwatch.cli.health_cmd:health",
    "diagnose": "clusterwatch.cli.diagnose_cmd:diagnose",
    "provenance": "clusterwatch.cli.provenance_cmd:provenance",
    "prolog": "clusterwatch.cli.hooks_cmd:prolog",
    "epilog": "clusterwatch.cli.hooks_cmd:epilog",
}


class LazyGroup(click.Group):
    """A group that imports a subcommand's module only when that subcommand runs.

    `--config FILE` is the group's (it is read before the subcommand parses its options), and is taken
    after the subcommand's name too: `clusterwatch status 4242 --config site.toml`.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, self._config_first(ctx, args))

    def invoke(self, ctx: click.Context):
        """A bad value from the config file or the environment is said as given there, not as a flag."""
        from click.core import ParameterSource

        try:
            return super().invoke(ctx)
        except click.BadParameter as exc:
            sub = exc.ctx
            if sub is None or exc.param is None or exc.param.name is None or sub.get_parameter_source(
                    exc.param.name) not in (ParameterSource.DEFAULT_MAP, ParameterSource.ENVIRONMENT):
                raise
            from .option_source import given_as

            raise ConfigError(f"{given_as(sub, exc.param)}: {exc.message}") from None

    def _config_first(self, ctx: click.Context, args: list[str]) -> list[str]:
        """`args` with a --config given after the subcommand's name moved before it."""
        at = 0
        while at < len(args) and args[at].startswith("-"):  # the group's own options
            at += 2 if args[at] == "--config" else 1
        if at >= len(args) or args[at] not in COMMANDS:
            return args
        command = self.get_command(ctx, args[at])
        if command is None:
            return args
        taking_values = {o for p in command.params if isinstance(p, click.Option) and not p.is_flag
                         and not p.count for o in p.opts}
        interspersed = command.context_settings.get("allow_interspersed_args", command.allow_interspersed_args)
        moved, rest, i = [], args[at + 1:], 0
        while i < len(rest):
            arg = rest[i]
            if arg == "--":  # what follows is the user's (run's command)
                break
            if arg == "--config" and i + 1 < len(rest):
                moved += rest[i:i + 2]
                del rest[i:i + 2]
                continue
            if arg.startswith("--config="):
                moved.append(rest.pop(i))
                continue
            if not arg.startswith("-") and not interspersed:
                break  # the command's arguments begin: `run python train.py --config x.yaml` is the user's
            i += 2 if arg in taking_values else 1
        return [*args[:at], *moved, args[at], *rest]

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name in COMMANDS if self._available(name))

    @staticmethod
    def _available(name: str) -> bool:
        module = COMMANDS[name].split(":")[0]
        return importlib.util.find_spec(module) is not None

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None or not self._available(name):
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="clusterwatch")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="TOML config file (default: $CLUSTERWATCH_CONFIG, else /etc/clusterwatch/config.toml).")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None) -> None:
    """Per-process GPU and host monitoring for Slurm training jobs.

    An agent on every node samples each process's GPU memory and utilisation, CPU
    and host memory; a collector aggregates every worker of a job, raises leak and
    stall alerts, and serves one Prometheus endpoint. `status JOBID` shows a job.
    """
    from clusterwatch.config import find_config, load_default_map

    from .option_source import CONFIG_FILE

    try:
        ctx.meta[CONFIG_FILE] = find_config(config_path)
        ctx.default_map = load_default_map(config_path)
        _check_keys(ctx, config_path)
    except ConfigError as exc:
        if ctx.invoked_subcommand in ("prolog", "epilog"):
            # a hook must never fail a job start or drain a node: say it, and go on with defaults
            click.echo(f"clusterwatch: {exc}; the hook goes on with defaults", err=True)
            return
        raise click.UsageError(str(exc)) from None


def _check_keys(ctx: click.Context, config_path: str | None) -> None:
    """ConfigError for a key of the file that no command of its section has (a typo was silently ignored).

    Only the section the invoked command reads is checked, so `status` imports no agent or collector
    module for it; a [cli] key counts when any of status, jobs, alerts, record takes it.
    """
    from clusterwatch.config import SECTIONS, find_config

    name = ctx.invoked_subcommand
    for section, commands in SECTIONS.items():
        if name not in commands or not ctx.default_map.get(name):
            continue
        group = ctx.command
        known = {p.name for c in commands if (cmd := group.get_command(ctx, c)) is not None for p in cmd.params}
        unknown = sorted(set(ctx.default_map[name]) - known)
        if unknown:
            raise ConfigError(f"config file {find_config(config_path)}: [{section}] has no setting "
                              f"{', '.join(unknown)}; settings are the long options of `clusterwatch "
                              f"{commands[0]} --help`, with underscores")


def main() -> None:
    """The console script."""
    from clusterwatch.grpc_fork import fork_handlers_off

    fork_handlers_off()  # before any subcommand loads grpc
    try:
        cli()
    except SystemExit as exc:
        _quick_exit(exc)
        raise
    except ClusterwatchError as exc:
        # the error tree's one handler: a command that did not say it itself still says one line, no traceback
        click.echo(f"clusterwatch: {exc}", err=True)
        sys.exit(2 if isinstance(exc, ConfigError) else 1)


def _quick_exit(exc: SystemExit) -> None:
    """Leave at once, skipping the interpreter's teardown, when the command allowed it.

    A query command asked for it (common.exit_quickly_when_done): it holds no file, thread or
    child that needs an orderly end, and the teardown of a process that loaded grpc costs ~45 ms.
    Only the output has to be flushed here; if that fails (a closed pipe), Python's own exit reports it.
    """
    common = sys.modules.get("clusterwatch.cli.common")
    code = 0 if exc.code is None else exc.code
    if common is None or not common.quick_exit or not isinstance(code, int):
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    os._exit(code)


if __name__ == "__main__":
    main()
