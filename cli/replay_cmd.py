"""`clusterwatch replay TRACE`: run the rule engine over a recorded trace."""
from __future__ import annotations

import sys

import click

from clusterwatch.errors import ConfigError, ParseError

from .help_text import examples


@click.command(epilog=examples(
    "clusterwatch replay job-4242.jsonl",
    "clusterwatch replay job-4242.jsonl --rules my_rules.toml --format jsonl",
))
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--rules", "rules_path", type=click.Path(dir_okay=False), default=None,
              help="Rules file (TOML). Default: the shipped default_rules.toml.")
@click.option("--format", "fmt", type=click.Choice(["human", "jsonl"]), default="human", show_default=True,
              help="human: one readable line per event; jsonl: one JSON object per event.")
@click.option("--xid-catalog", "xid_catalog_path", type=click.Path(dir_okay=False), default=None,
              envvar="CLUSTERWATCH_XID_CATALOG",
              help="The site's XID catalog the collector ran with (TOML, as its --xid-catalog), for the trace's "
                   "GPU health records (CLUSTERWATCH_XID_CATALOG). Default: the shipped one.")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Processes that share the trace's series (default: one per idle core, up to 4, for traces "
                   "of 16 MB or more; else 1). The output is the same for any number.")
def replay(trace: str, rules_path: str | None, fmt: str, xid_catalog_path: str | None, jobs: int | None) -> None:
    """Replay TRACE (JSON lines, docs/traces.md) through the leak and stall rules, and its GPU
    health records through the health rules (gpu_xid, gpu_lost, gpu_memory_errors, gpu_throttle,
    gpu_link_errors).

    Prints every alert event (pending, firing, resolved) in trace time. Malformed
    trace lines are skipped and counted on stderr; a trace without one valid line exits 1;
    an unreadable trace or a bad rules file exits 2. When nothing is raised, stderr says so.
    """
    from pathlib import Path

    from clusterwatch.collector.health.xid_catalog import CatalogError, load_catalog
    from clusterwatch.collector.rules import load_rules
    from clusterwatch.collector.traces.replay import ReplayStats, event_human, event_json, replay_file

    from clusterwatch.report.text import printable

    try:
        rules = load_rules(rules_path)
    except ConfigError as exc:
        click.echo(f"clusterwatch replay: {exc}", err=True)
        sys.exit(2)
    try:
        catalog = load_catalog(Path(xid_catalog_path) if xid_catalog_path else None)
    except CatalogError as exc:
        click.echo(f"clusterwatch replay: {exc}", err=True)
        sys.exit(2)
    stats = ReplayStats()
    out = sys.stdout.buffer
    events = 0
    try:
        if fmt == "jsonl":
            for ev in replay_file(trace, rules, stats, jobs, catalog):
                out.write(event_json(ev) + b"\n")
                events += 1
        else:
            for ev in replay_file(trace, rules, stats, jobs, catalog):
                out.write(printable(event_human(ev)).encode() + b"\n")
                events += 1
    except ParseError as exc:
        click.echo(f"clusterwatch replay: {exc}", err=True)
        sys.exit(2)
    out.flush()
    if stats.samples == 0:
        # nothing to judge: a wrong file (a log, a rules file, an empty one) must not pass for a calm trace
        why = _bad_lines(stats) or "the file has no line"
        click.echo(f"clusterwatch replay: {trace}: no valid trace line ({why}); "
                   "a trace is JSON lines with t, node and pid (docs/traces.md), as `clusterwatch record` writes",
                   err=True)
        sys.exit(1)
    if stats.bad_lines:
        click.echo(f"clusterwatch replay: {trace}: {_bad_lines(stats)}", err=True)
    if not events:
        click.echo(f"clusterwatch replay: {trace}: no alert raised over {stats.samples} observations", err=True)


def _bad_lines(stats) -> str:
    """'skipped N malformed line(s) (line 3: not JSON; ...)', or '' when none was."""
    if not stats.bad_lines:
        return ""
    where = "; ".join(f"line {n}: {why}" for n, why in stats.first_bad)
    more = "; ..." if stats.bad_lines > len(stats.first_bad) else ""
    return f"skipped {stats.bad_lines} malformed line(s) ({where}{more})"
