"""`clusterwatch alerts`: the alerts the collector holds, active first."""
from __future__ import annotations

import time

import click

from .common import collector_option, deployment, fail, query_metadata
from .help_text import examples


def render_alerts(entries, now: float) -> str:
    """A table of alerts: state, rule, job, where, since when, and the one-line description."""
    from clusterwatch.report.text import fit, human_duration, printable_message

    if not entries:
        return "no alerts\n"
    entries = [printable_message(e) for e in entries]
    out = [f"{'STATE':<9} {'SEVERITY':<9} {'RULE':<17} {'JOB':<12} {'NODE':<12} {'RANK':>5} {'FOR':>9}  DESCRIPTION"]
    for e in entries:
        a = e.alert
        rank = str(a.rank) if a.HasField("rank") else "-"
        end = a.resolved_at or now
        out.append(f"{a.state:<9} {a.severity:<9} {a.rule:<17} {fit(e.job_id or '-', 12):<12} "
                   f"{fit(a.node, 12):<12} {rank:>5} {human_duration(end - a.since):>9}  {a.description}")
    return "\n".join(out) + "\n"


@click.command(epilog=examples(
    "clusterwatch alerts",
    "clusterwatch alerts --job 4242 --all",
    "clusterwatch alerts --json",
))
@collector_option
@click.option("--job", "job_id", default="", help="Only this job's alerts.")
@click.option("--all", "include_resolved", is_flag=True, help="Also the latest resolved alerts.")
@click.option("--limit", type=click.IntRange(min=1), default=200, show_default=True,
              help="With --all: at most this many resolved alerts, the latest (pending and firing ones are all "
                   "listed).")
@click.option("--json", "as_json", is_flag=True, help="Print the alerts as JSON.")
def alerts(collector: str, collectors_before: str, tls_ca: str | None, job_id: str, include_resolved: bool,
           limit: int, as_json: bool) -> None:
    """List alerts: pending and firing, and with --all the latest resolved ones."""
    import grpc
    from clusterwatch.v1 import query_pb2

    from .status_cmd import _explain, _stub, ask_all

    found = deployment(collector, collectors_before)
    request = query_pb2.ListAlertsRequest(job_id=job_id, include_resolved=include_resolved, limit=limit)
    if not job_id:  # every collector's, merged
        answers, partial = ask_all(found.all, tls_ca, "the alert list",
                          lambda stub, metadata: stub.ListAlerts(request, timeout=5.0, metadata=metadata))
        resp = query_pb2.ListAlertsResponse(alerts=merge_alerts([e for a in answers for e in a.alerts], limit))
    else:  # the job's collector holds all of its alerts
        partial = False
        collector = found.for_job(job_id)
        channel, stub = _stub(collector, tls_ca)
        try:
            resp = stub.ListAlerts(request, timeout=5.0, metadata=query_metadata())
        except grpc.RpcError as exc:
            fail(_explain(exc, collector, "the alert list"), code=1)
        finally:
            channel.close()
    if job_id and not resp.alerts:
        _check_job_known(collector, tls_ca, job_id)
    if as_json:  # docs/json.md: the alert object status has too
        from clusterwatch.json_view import alerts_document, dumps

        click.echo(dumps(alerts_document(resp)), nl=False)
    else:
        click.echo(render_alerts(list(resp.alerts), time.time()), nl=False)
    if partial:
        raise SystemExit(1)


def merge_alerts(entries, limit: int) -> list:
    """Several collectors' alerts as one collector lists them: active before resolved, newest first, at most `limit`.

    A node-wide alert (agent_down, no job) of a node whose agent streams to several collectors is the same
    alert on each: it is listed once.
    """
    seen: set[tuple] = set()
    out = []
    for e in sorted(entries, key=lambda e: (e.alert.state == "resolved", -e.alert.since)):
        key = (e.job_id, e.alert.rule, e.alert.node, e.alert.rank if e.alert.HasField("rank") else None,
               e.alert.since, e.alert.state)
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out[:limit]


def _check_job_known(collector: str, tls_ca: str | None, job_id: str) -> None:
    """No alerts for --job: one line and exit 1 when the collector does not know the job at all (a typo)."""
    import grpc

    from .status_cmd import _explain, fetch_job

    try:
        fetch_job(collector, job_id, trend_points=0, tls_ca=tls_ca)
    except grpc.RpcError as exc:
        fail(_explain(exc, collector, f"status {job_id}"), code=1)
