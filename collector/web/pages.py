"""The pages' contents, handed to their templates (templating.py: escaped by default).

The page's only script is REFRESH_JS, allowed by its hash in the Content-Security-Policy (app.py): a
script that a hostile name smuggled in would not run even were it not escaped.
"""
from __future__ import annotations

import base64
import hashlib

from clusterwatch.v1 import query_pb2
from markupsafe import Markup

from clusterwatch.report.sections import job_sections
from clusterwatch.report.text import printable_message

from .history import GpuCharts, RankCharts
from .job_charts import DEFAULT_RANGE, RANGES, job_charts
from .templating import render

# Every 15 s the page fetches itself and swaps its <main> in place (scroll position kept), until the user
# changes a form field on it (the swap would undo an unticked "with memory snapshots").
REFRESH_JS = ("var changed=false;document.addEventListener('change',function(){changed=true;});"
              "setInterval(function(){if(changed)return;"
              "fetch(location.href).then(function(r){return r.ok?r.text():null})"
              ".then(function(t){if(!t)return;var d=new DOMParser().parseFromString(t,'text/html');"
              "var m=d.querySelector('main');if(m)document.querySelector('main').replaceWith(m);})"
              ".catch(function(){});},15000);")
REFRESH_JS_HASH = "sha256-" + base64.b64encode(hashlib.sha256(REFRESH_JS.encode()).digest()).decode()

MAX_ENDED_LISTED = 100
SEVERITY_ORDER = {"normal": 0, "warning": 1, "critical": 2}


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


def page_context(title: str, refresh: bool = True) -> dict:
    """What base.html needs; `refresh`: the page refetches itself every 15 s (not a confirmation, an action's
    answer or an error page: those would lose their form or answer, or ask again for what is not there)."""
    return {"title": title, "refresh_js": Markup(REFRESH_JS) if refresh else None}  # a constant of this module


def message_page(title: str, text: str) -> str:
    """A page that says one thing (an error, a refusal), not refreshed."""
    return render("message.html", text=text, **page_context(title, refresh=False))


def listed(jobs: list[query_pb2.JobInfo]) -> list[query_pb2.JobInfo]:
    """The jobs the index lists: running ones first, then the recent ended ones, newest first."""
    jobs = sorted(jobs, key=lambda j: (j.end_time > 0, -(j.start_time or j.submit_time)))
    running = [j for j in jobs if not j.end_time]
    ended = [j for j in jobs if j.end_time][:MAX_ENDED_LISTED]  # a store holds months of jobs
    return running + ended


def index_page(jobs: list[query_pb2.JobInfo], firing: dict[str, int], refused_note: str = "") -> str:
    """The listed jobs (listed()), each with how many of its alerts count as firing (counts_as_firing, as
    its page's badge counts them)."""
    return render("index.html", jobs=listed(jobs), firing=firing, refused_note=refused_note,
                  **page_context("clusterwatch: jobs"))


def job_page(view: query_pb2.JobView, status_text: str, ranks: list[RankCharts], gpus: list[GpuCharts],
             stored: bool, actions: dict | None = None, range_key: str = DEFAULT_RANGE) -> str:
    """One job: header, badge, actions (action_pages.actions_section), alerts with their explanation, charts
    over the last `range_key` of job_charts.RANGES, then the status report's sections as tables (report.html)
    with its text whole beneath."""
    charts = job_charts(view, ranks, gpus, stored, range_key)  # the alerts' ranks and nodes as the history has them
    view = printable_message(view)  # a bidirectional override or ESC in a name shown, as status shows it
    job = view.job
    power = [(g.label, g.power_watts) for g in gpus if g.power_watts is not None]
    return render("job.html", job=job, level=badge(view.alerts), gpu_count=job.gpus or len(view.gpus),
                  stored=stored, tags=sorted(view.tags.items()), actions=actions or None, alerts=_alerts(view),
                  health=_health(view), charts=charts, power=power, ranges=RANGES, range_key=range_key,
                  report=job_sections(view), status_text=status_text,
                  **page_context(f"clusterwatch: job {job.job_id}"))


def _alerts(view: query_pb2.JobView) -> list[dict]:
    order = {"firing": 0, "pending": 1, "ended": 2, "resolved": 3}
    items = []
    for a in sorted(view.alerts, key=lambda a: (order.get(alert_state(a), 4), -a.since)):
        state = alert_state(a)
        where = ", ".join(x for x in (f"rank {a.rank}" if a.HasField("rank") else "", a.node,
                                      f"pid {a.pid}" if a.pid else "", a.gpu) if x)
        items.append({"severity": a.severity, "state": state, "rule": a.rule, "where": where, "since": a.since,
                      "shown": "ENDED WHILE FIRING" if state == "ended" else state.upper(),
                      "description": a.description})
    return items


def _health(view: query_pb2.JobView) -> list[dict]:
    """Health findings on the job's GPUs (XIDs, lost GPUs, memory errors, throttling), worst first as held."""
    return [{"severity": h.severity, "rule": h.rule, "time": h.time, "description": h.description,
             "advice": h.advice,
             "where": ", ".join(x for x in (f"rank {h.rank}" if h.HasField("rank") else "", h.node, h.gpu) if x)}
            for h in view.health]
