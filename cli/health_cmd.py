"""`clusterwatch health [NODE]`: for operators, the GPUs with health findings, worst first, with the jobs they hit."""
from __future__ import annotations

import time

import click

from .common import collector_option, deployment
from .help_text import examples

HEALTH_SCHEMA = "clusterwatch.health/1"
_SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2, "": 3}


def merge_rows(rows: list) -> list:
    """Several collectors' rows as one list: a GPU once (a node streams to each of its collectors), worst first."""
    best: dict[tuple[str, str], object] = {}
    for r in rows:
        key = (r.node, r.gpu)
        held = best.get(key)
        if held is None or len(r.findings) > len(held.findings):
            best[key] = r
    return sorted(best.values(), key=lambda r: (_SEVERITY_ORDER.get(r.severity, 3), not r.lost, r.node,
                                                r.index if r.HasField("index") else 1 << 30, r.gpu))


def _counters(r) -> str:
    parts = []
    if r.lost:
        parts.append("LOST")
    if r.xids:
        parts.append("XID " + ", ".join(f"{x.xid}×{x.count}" if x.count > 1 else str(x.xid) for x in r.xids))
    if r.HasField("ecc_uncorrected_volatile") and r.ecc_uncorrected_volatile:
        parts.append(f"{r.ecc_uncorrected_volatile} uncorrected ECC")
    if r.throttle_reasons:
        parts.append("throttled: " + ", ".join(r.throttle_reasons))
    if r.HasField("temperature_c"):
        parts.append(f"{r.temperature_c} °C")
    if r.recovery_action:
        parts.append(f"NVML asks: {r.recovery_action}")
    return "; ".join(parts)


def render_health(rows: list, now: float) -> str:
    """One block per GPU: where, how bad, the jobs hit, its counters, then its findings with their advice."""
    from clusterwatch.report.text import fit, human_duration, printable

    if not rows:
        return "no GPU with health findings\n"
    out = [f"{'SEVERITY':<9} {'NODE':<16} {'GPU':>3}  {'JOBS':<20} STATE"]
    for r in rows:
        index = str(r.index) if r.HasField("index") else "-"
        jobs = fit(", ".join(r.jobs) or "-", 20)
        out.append(f"{r.severity or '-':<9} {fit(printable(r.node), 16):<16} {index:>3}  {jobs:<20} "
                   f"{printable(_counters(r)) or 'findings only'}")
        out.append(f"{'':<9} {printable(r.gpu)}")
        for f in r.findings:
            out.append(f"{'':<9} - {human_duration(max(0.0, now - f.time))} ago: {printable(f.description)}")
            if f.advice:
                out.append(f"{'':<9}   {printable(f.advice)}")
    return "\n".join(out) + "\n"


@click.command(epilog=examples(
    "clusterwatch health",
    "clusterwatch health gpu-node-017 --json",
    "clusterwatch health --history gpu-node-017",
))
@click.argument("node", required=False, default="")
@collector_option
@click.option("--json", "as_json", is_flag=True, help="Print the GPUs as JSON (docs/json.md).")
@click.option("--history", is_flag=True,
              help="Show what clusterwatch did on its own (drains, notifications, resumes), newest first.")
def health(node: str, collector: str, collectors_before: str, tls_ca: str | None, as_json: bool,
           history: bool) -> None:
    """GPUs with health findings (XIDs, lost GPUs, memory errors, throttling), worst first, for operators.

    NODE: only this node's GPUs. Needs an admin of the collector (its --query-admin, or root); a user's own
    jobs' health is in `clusterwatch status JOBID`.
    """
    from clusterwatch.v1 import query_pb2

    from .status_cmd import ask_all

    found = deployment(collector, collectors_before)
    if history:
        _history(node, found, tls_ca, as_json)
        return
    request = query_pb2.ListHealthRequest(node=node)
    # a node's health is held by the collector its name picks (one line and exit 1 where it is unknown there)
    answers, partial = ask_all((found.for_node(node),) if node else found.all, tls_ca, "the GPUs' health",
                               lambda stub, metadata: stub.ListHealth(request, timeout=5.0, metadata=metadata))
    rows = merge_rows([r for a in answers for r in a.gpus])
    # a node's fabric (its InfiniBand / RoCE ports, its NVSwitches) is held by the collector its name picks: once
    nodes = sorted({r.node: r for a in answers for r in a.nodes}.values(),
                   key=lambda r: (_SEVERITY_ORDER.get(r.severity, 3), r.node))
    if as_json:
        from clusterwatch.json_view import dumps, message_to_json

        click.echo(dumps({"schema": HEALTH_SCHEMA, "gpus": [message_to_json(r) for r in rows],
                          "nodes": [message_to_json(r) for r in nodes]}), nl=False)
    else:
        click.echo(render_health(rows, time.time()), nl=False)
        from clusterwatch.report.text import printable

        for r in nodes:
            click.echo(f"{r.severity or '-':<9} {printable(r.node)}: fabric")
            for f in r.findings:
                click.echo(f"{'':<9} - {printable(f.description)}")
    if partial:
        raise SystemExit(1)


def _history(node: str, found, tls_ca: str | None, as_json: bool) -> None:
    """The audit trails of every collector (a job's actions are on its collector, a node's on its own)."""
    from clusterwatch.v1 import actions_pb2, actions_pb2_grpc

    from .health_history import HISTORY_SCHEMA, merge_actions, merge_offenders, render_actions, render_offenders
    from .status_cmd import ask_all

    request = actions_pb2.ListActionsRequest(node=node, limit=200)
    answers, partial = ask_all(found.all, tls_ca, "the automatic actions",
                               lambda stub, metadata: stub.ListActions(request, timeout=5.0, metadata=metadata),
                               stub_class=actions_pb2_grpc.ActionsStub)
    actions = merge_actions(answers)[:200]
    gpus, nodes = merge_offenders(answers, "gpus"), merge_offenders(answers, "nodes")
    if as_json:
        from clusterwatch.json_view import dumps, message_to_json

        click.echo(dumps({"schema": HISTORY_SCHEMA, "actions": [message_to_json(a) for a in actions],
                          "gpus": [message_to_json(o) for o in gpus],
                          "nodes": [message_to_json(o) for o in nodes]}), nl=False)
    else:
        click.echo(render_actions(actions) + render_offenders(gpus, nodes), nl=False)
    if partial:
        raise SystemExit(1)
