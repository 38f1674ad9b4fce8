"""The HTML of the pages: every figure and every text from users (job names, commands, tags) escaped.

The page's only script is REFRESH_JS, allowed by its hash in the Content-Security-Policy (app.py): a
script that a hostile name smuggled in would not run even were it not escaped.
"""
from __future__ import annotations

import base64
import hashlib
import time
from html import escape

from clusterwatch.v1 import query_pb2

from .charts import line_chart
from .history import GpuCharts, RankCharts

# Every 15 s the page fetches itself and swaps its <main> in place (scroll position kept), until the user
# changes a form field on it (the swap would undo an unticked "with memory snapshots").
REFRESH_JS = ("var changed=false;document.addEventListener('change',function(){changed=true;});"
              "setInterval(function(){if(changed)return;"
              "fetch(location.href).then(function(r){return r.ok?r.text():null})"
              ".then(function(t){if(!t)return;var d=new DOMParser().parseFromString(t,'text/html');"
              "var m=d.querySelector('main');if(m)document.querySelector('main').replaceWith(m);})"
              ".catch(function(){});},15000);")
REFRESH_JS_HASH = "sha256-" + base64.b64encode(hashlib.sha256(REFRESH_JS.encode()).digest()).decode()

STYLE = """
body{font-family:system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#24292f;color:#fff;padding:8px 16px}header a{color:#fff}
main{padding:12px 16px;max-width:1200px}
table{border-collapse:collapse;margin:8px 0;display:block;overflow-x:auto;max-width:100%}
td,th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:left;white-space:nowrap}
.badge{display:inline-block;padding:2px 10px;border-radius:10px;color:#fff;font-weight:bold}
.normal{background:#2da44e}.warning{background:#bf8700}.critical{background:#cf222e}
.charts{display:flex;flex-wrap:wrap;gap:12px}
figure.chart{margin:0;background:#fff;border:1px solid #ddd;padding:6px;width:100%;max-width:576px;
  box-sizing:border-box}
figure.chart svg{width:100%;height:160px;display:block}
.axis{stroke:#888}.tick{font-size:10px;fill:#555}.legend{font-size:12px;overflow-wrap:anywhere}
pre{background:#fff;border:1px solid #ddd;padding:8px;overflow-x:auto;font-size:12px}
.alert{margin:6px 0;padding:6px;background:#fff;border-left:4px solid #bf8700}
.alert.critical{border-color:#cf222e}.alert.resolved{border-color:#888}
.actions form{display:inline-block;margin:4px 8px 4px 0}.actions button{padding:4px 12px}
.refused{padding:6px;background:#fff;border-left:4px solid #cf222e}
""".strip()

MAX_ENDED_LISTED = 100
SEVERITY_ORDER = {"normal": 0, "warning": 1, "critical": 2}


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def counts_as_firing(a) -> bool:
    """Firing, or resolved only because its process or job ended while it fired (status's "ended": it
    never cleared, the process took it along)."""
    return a.state == "firing" or (a.state == "resolved" and a.ended_while_firing)


def alert_state(a) -> str:
    """An alert's state as `status` says it: "ended" for one that ended while firing."""
    return "ended" if a.state == "resolved" and a.ended_while_firing else a.state


def badge(alerts) -> str:
    """normal, warning or critical: the worst severity among the alerts firing or ended while firing (info
    counts as normal)."""
    worst = "normal"
    for a in alerts:
        if not counts_as_firing(a):
            continue
        level = "critical" if a.severity == "critical" else "warning" if a.severity != "info" else "normal"
        if SEVERITY_ORDER[level] > SEVERITY_ORDER[worst]:
            worst = level
    return worst


def page(title: str, body: str, refresh: bool = True) -> str:
    """A whole page; `refresh`: it refetches itself every 15 s (not a confirmation, an action's answer or
    an error page: those would lose their form or answer, or ask again for what is not there)."""
    script = f"<script>{REFRESH_JS}</script>" if refresh else ""
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>"
            "<header><a href=\"/\">clusterwatch</a></header>"
            f"<main>{body}</main>{script}</body></html>")


def message_page(title: str, text: str) -> str:
    return page(title, f"<h1>{escape(title)}</h1><p>{escape(text)}</p>", refresh=False)


def listed(jobs: list[query_pb2.JobInfo]) -> list[query_pb2.JobInfo]:
    """The jobs the index lists: running ones first, then the recent ended ones, newest first."""
    jobs = sorted(jobs, key=lambda j: (j.end_time > 0, -(j.start_time or j.submit_time)))
    running = [j for j in jobs if not j.end_time]
    ended = [j for j in jobs if j.end_time][:MAX_ENDED_LISTED]  # a store holds months of jobs
    return running + ended


def index_page(jobs: list[query_pb2.JobInfo], firing: dict[str, int], refused_note: str = "") -> str:
    """The listed jobs (listed()), each with how many of its alerts count as firing (counts_as_firing, as
    its page's badge counts them)."""
    jobs = listed(jobs)
    rows = []
    for j in jobs:
        n = firing.get(j.job_id, 0)
        rows.append(
            f'<tr><td><a href="/jobs/{escape(_quote(j.job_id))}">{escape(j.job_id)}</a></td>'
            f"<td>{escape(j.name)}</td><td>{escape(j.user)}</td><td>{escape(j.state)}</td>"
            f'<td class="{"warning" if n else ""}">{n}</td>'
            f"<td>{escape(_when(j.start_time))}</td></tr>")
    table = ("<table><tr><th>Job</th><th>Name</th><th>User</th><th>State</th><th>Alerts firing</th>"
             "<th>Started</th></tr>" + "".join(rows) + "</table>") if rows else "<p>No jobs yet.</p>"
    note = f"<p>{escape(refused_note)}</p>" if refused_note else ""
    return page("clusterwatch: jobs", f"<h1>Jobs</h1>{note}{table}")


def _quote(job_id: str) -> str:
    from urllib.parse import quote

    return quote(job_id, safe="")


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t)) if t else "-"  # with its zone, as status


def job_page(view: query_pb2.JobView, status_text: str, ranks: list[RankCharts], gpus: list[GpuCharts],
             stored: bool, actions: str = "") -> str:
    """One job: header, badge, actions (actions_section), alerts with their explanation, charts, then the
    status report whole."""
    job = view.job
    level = badge(view.alerts)
    head = (f'<h1>Job {escape(job.job_id)} <span class="name">{escape(job.name)}</span> '
            f'<span id="badge" class="badge {level}">{level}</span></h1>'
            f"<p>{escape(job.user or '?')} · {escape(job.state)} · {len(job.nodes)} node(s) · "
            f"{job.gpus or len(view.gpus)} GPU(s)"
            + (" · from the summary stored when the job ended" if stored else "") + "</p>")
    if view.tags:
        head += "<p>Tags: " + ", ".join(f"{escape(k)}={escape(v)}" for k, v in sorted(view.tags.items())) + "</p>"
    return page(f"clusterwatch: job {job.job_id}",
                head + actions + _alerts(view) + _health(view) + _charts(ranks, gpus, stored)
                + f"<h2>Report (as <code>clusterwatch status</code> prints it)</h2><pre id=\"status\">"
                f"{escape(status_text)}</pre>")


def _alerts(view: query_pb2.JobView) -> str:
    if not view.alerts:
        return "<h2>Alerts</h2><p>None.</p>"
    order = {"firing": 0, "pending": 1, "ended": 2, "resolved": 3}
    items = []
    for a in sorted(view.alerts, key=lambda a: (order.get(alert_state(a), 4), -a.since)):
        state = alert_state(a)
        where = ", ".join(x for x in (f"rank {a.rank}" if a.HasField("rank") else "", a.node,
                                      f"pid {a.pid}" if a.pid else "", a.gpu) if x)
        shown = "ENDED WHILE FIRING" if state == "ended" else state.upper()
        items.append(f'<div class="alert {escape(a.severity)} {escape(state)}" data-rule="{escape(a.rule)}" '
                     f'data-state="{escape(state)}">'
                     f"<b>{escape(shown)}</b> {escape(a.rule)} ({escape(a.severity)}; {escape(where)}"
                     f", since {escape(_when(a.since))})<br>{escape(a.description)}</div>")
    return "<h2>Alerts</h2>" + "".join(items)


def _health(view: query_pb2.JobView) -> str:
    """Health findings on the job's GPUs (XIDs, lost GPUs, memory errors, throttling), worst first as held."""
    if not view.health:
        return ""
    items = []
    for h in view.health:
        where = ", ".join(x for x in (f"rank {h.rank}" if h.HasField("rank") else "", h.node, h.gpu) if x)
        advice = f"<br><i>{escape(h.advice)}</i>" if h.advice else ""
        items.append(f'<div class="alert {escape(h.severity)}" data-health="{escape(h.rule)}">'
                     f"<b>{escape(h.rule)}</b> ({escape(h.severity)}; {escape(where)}, {escape(_when(h.time))})"
                     f"<br>{escape(h.description)}{advice}</div>")
    return "<h2>Health events</h2>" + "".join(items)


def _charts(ranks: list[RankCharts], gpus: list[GpuCharts], stored: bool) -> str:
    axis = " (the summary's trend, evenly resampled)" if stored else ""
    timed = not stored
    charts = [
        line_chart("GPU memory per rank" + axis, [(r.label, r.gpu_memory) for r in ranks], human_bytes, timed),
        line_chart("Host memory (RSS) per rank" + axis, [(r.label, r.rss) for r in ranks], human_bytes, timed),
    ]
    if not stored:
        allocator = [(f"{r.label} {name}", pts) for r in ranks
                     for name, pts in (("allocated", r.gpu_allocated), ("reserved", r.gpu_reserved)) if pts]
        if allocator:  # only where a process reports its allocator (clusterwatch.train)
            charts.append(line_chart("GPU memory as the allocator sees it per rank", allocator, human_bytes))
        charts.append(line_chart("GPU utilisation per rank", [(r.label, r.gpu_utilization) for r in ranks],
                                 lambda v: f"{v:.0f}%"))
        charts.append(line_chart("CPU per rank", [(r.label, r.cpu_percent) for r in ranks], lambda v: f"{v:.0f}%"))
        charts.append(line_chart("Steps per second per rank", [(r.label, r.steps_per_s) for r in ranks]))
        charts.append(line_chart("GPU memory used per GPU", [(g.label, g.memory_used) for g in gpus], human_bytes))
        charts.append(line_chart("GPU power per GPU", [(g.label, g.power) for g in gpus], lambda v: f"{v:.0f} W"))
    charts.append(line_chart("GPU utilisation" + axis, [(g.label, g.utilization) for g in gpus],
                             lambda v: f"{v:.0f}%", timed))
    power = [f"<td>{escape(g.label)}</td><td>{g.power_watts:.0f} W</td>" for g in gpus if g.power_watts is not None]
    power_table = ("<table><tr><th>GPU</th><th>Power (latest)</th></tr>"
                   + "".join(f"<tr>{p}</tr>" for p in power) + "</table>") if power else ""
    return f'<h2>Charts</h2><div class="charts">{"".join(charts)}</div>{power_table}'
