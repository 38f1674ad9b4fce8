"""Prometheus's file-based target list (file_sd) of a sharded deployment, from its collectors list.

    python3 -m clusterwatch.prometheus_targets --config /etc/clusterwatch/config.toml \\
        -o /etc/prometheus/clusterwatch-collectors.json

The collectors list names each collector's gRPC address (HOST:PORT, what agents and the CLI dial); its
/metrics is on the same host at the metrics port of the same rank: 9750 for 50051, 9751 for 50052, ...
(the template unit deploy/systemd/clusterwatch-collector@.service keeps that rule). `--metrics` gives
the /metrics addresses in the list's order instead. Each target carries `shard` (the gRPC address), so
a dashboard can tell the collectors apart; series never overlap between collectors, so sums across them
are right. The file is replaced whole (Prometheus re-reads it on change and must never see half of it).
"""
from __future__ import annotations

import json
import os
import sys

import click

DEFAULT_GRPC_PORT = 50051
DEFAULT_METRICS_PORT = 9750


def metrics_address(grpc_address: str) -> str:
    """The /metrics address beside a collector's gRPC address (the port of the same rank above 9750)."""
    host, sep, port = grpc_address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise click.BadParameter(f"{grpc_address!r} is not HOST:PORT; give --metrics for each collector")
    offset = int(port) - DEFAULT_GRPC_PORT
    if not 0 <= offset < 1000:
        raise click.BadParameter(f"{grpc_address}: the metrics port follows from gRPC ports 50051-51050 only; "
                                 "give --metrics HOST:PORT,... in the same order")
    return f"{host}:{DEFAULT_METRICS_PORT + offset}"


def targets(collectors: tuple[str, ...], metrics: tuple[str, ...] | None = None) -> list[dict]:
    """The file_sd document: one target group per collector, labelled with its shard."""
    if metrics is not None and len(metrics) != len(collectors):
        raise click.BadParameter(f"--metrics names {len(metrics)} addresses for {len(collectors)} collectors")
    found = metrics if metrics is not None else tuple(metrics_address(c) for c in collectors)
    return [{"targets": [m], "labels": {"shard": c}} for c, m in zip(collectors, found, strict=True)]


@click.command()
@click.option("--config", "config_path", default=None, help="The config file whose top-level `collectors` to use.")
@click.option("--collectors", default=None, metavar="HOST:PORT,...", help="The collectors list (instead of --config).")
@click.option("--metrics", default=None, metavar="HOST:PORT,...", help="Their /metrics addresses, in the same order.")
@click.option("-o", "--output", default="-", help="The targets file to write (- for stdout).")
def main(config_path: str | None, collectors: str | None, metrics: str | None, output: str) -> None:
    """Write Prometheus's file_sd targets for every collector of the deployment."""
    from .errors import ConfigError
    from .shards import ShardError, parse_list

    try:
        if collectors is None:
            from .config import find_config, load_default_map

            if find_config(config_path) is None:
                raise click.UsageError("no collectors: give --collectors a,b,c, or --config FILE with "
                                       "collectors = [...]")
            collectors = load_default_map(config_path).get("status", {}).get("collector")
            if not collectors:
                raise click.UsageError("the config file has no top-level collectors = [...]")
        members = parse_list(collectors, "--collectors")
        doc = targets(members, parse_list(metrics, "--metrics") if metrics else None)
    except (ShardError, ConfigError) as exc:
        raise click.UsageError(str(exc)) from None
    text = json.dumps(doc, indent=2) + "\n"
    if output == "-":
        sys.stdout.write(text)
        return
    tmp = f"{output}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, output)
    click.echo(f"wrote {len(doc)} collectors to {output}", err=True)


if __name__ == "__main__":
    main()
