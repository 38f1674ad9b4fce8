"""Which charts a job's page shows, over which time, and which rank each one puts forward.

An alert about a rank is what a person opened the page for: its rank gets a chart of its own (its own
y axis, so a leak of a few per cent on a large base fills it) and is drawn red against the other ranks,
greyed, on the chart of the figure the alert is about. Every alert is shaded on those charts from when it
went pending to when it resolved. All charts of a page share one time span, chosen from RANGES.
"""
from __future__ import annotations

from clusterwatch.v1 import query_pb2

from .charts import CPU_PERCENT, PERCENT, PLAIN, RATE, STEPS, WATTS, Chart, Mark, Span, bytes_unit, line_chart
from .history import GpuCharts, RankCharts

# the choice of time span: its query value, what the page says, seconds (None: all the history held)
RANGES = (("5m", "5 min", 300.0), ("15m", "15 min", 900.0), ("1h", "1 hour", 3600.0), ("all", "all held", None))
DEFAULT_RANGE = "all"

# the figure each rule is about (the RankCharts field), where it is about one
RULE_FIGURES = {"gpu_memory_leak": "gpu_memory", "host_memory_leak": "rss", "training_stall": "steps_per_s",
                "gpu_stall": "gpu_utilization", "idle_gpu": "gpu_utilization"}
# per-rank figures, in the order they are shown: (field, title, unit or None for bytes)
RANK_FIGURES = (("gpu_memory", "GPU memory per rank", None), ("rss", "Host memory (RSS) per rank", None),
                ("gpu_utilization", "GPU utilisation per rank", PERCENT), ("cpu_percent", "CPU per rank", CPU_PERCENT),
                ("steps_per_s", "Steps per second per rank", STEPS), ("loss", "Loss per rank", PLAIN),
                ("lr", "Learning rate per rank", RATE))
FOCUS_MIN_SPAN = 0.02
SHOWN_STATES = ("firing", "pending", "ended")  # alerts that put their rank forward (resolved ones are only shaded)


def span_of(range_key: str, now: float, ranks: list[RankCharts], gpus: list[GpuCharts]) -> Span:
    """The span every chart shows: the last `range_key` of RANGES up to `now`, or all that is held."""
    seconds = dict((k, s) for k, _, s in RANGES).get(range_key)
    firsts = [pts[0][0] for r in ranks for pts in (r.gpu_memory, r.rss, r.gpu_utilization, r.cpu_percent,
                                                   r.steps_per_s, r.loss, r.lr) if pts]
    firsts += [pts[0][0] for g in gpus for pts in (g.utilization, g.memory_used, g.power) if pts]
    start = min(firsts, default=now - 60.0)
    if seconds is not None:
        start = max(start, now - seconds)
    return Span(start, now)


def _state(a) -> str:
    return "ended" if a.state == "resolved" and a.ended_while_firing else a.state


def marks_of(alerts) -> list[tuple[str, Mark]]:
    """(the figure it is about, or "" for none, its mark) for each alert."""
    out = []
    for a in alerts:
        end = a.resolved_at or None
        out.append((RULE_FIGURES.get(a.rule, ""), Mark(a.rule, a.since or a.fired_at, end,
                                                       a.rank if a.HasField("rank") else None, _state(a),
                                                       a.fired_at)))
    return out


def _bytes(series: list) -> object:
    top = max((y for _, pts in series for _, y in pts), default=0.0)
    return bytes_unit(top)


def job_charts(view: query_pb2.JobView, ranks: list[RankCharts], gpus: list[GpuCharts], stored: bool,
               range_key: str = DEFAULT_RANGE) -> list[Chart]:
    """The page's charts: one for each alerted rank's figure first, then every per-rank figure (the alerted
    rank red against the others), then the GPUs'. An ended job's stored trends have no times: they are
    drawn against their order, its per-rank memory and GPU utilisation only."""
    if stored:
        note = " (the summary's trend, evenly resampled)"
        span = Span(None, 0.0)
        memory = [(r.label, r.gpu_memory) for r in ranks]
        rss = [(r.label, r.rss) for r in ranks]
        return [line_chart("GPU memory per rank" + note, memory, _bytes(memory), span),
                line_chart("Host memory (RSS) per rank" + note, rss, _bytes(rss), span),
                line_chart("GPU utilisation" + note, [(g.label, g.utilization) for g in gpus], PERCENT, span)]
    span = span_of(range_key, view.now, ranks, gpus)
    marks = marks_of(view.alerts)
    by_rank = {r.rank: r for r in ranks if r.rank is not None}
    charts: list[Chart] = []
    seen = set()
    for figure, mark in marks:  # the alerted ranks' own charts
        rank = by_rank.get(mark.rank)
        if rank is None or not figure or mark.state not in SHOWN_STATES or (figure, mark.rank) in seen:
            continue
        seen.add((figure, mark.rank))
        title = dict((f, t) for f, t, _ in RANK_FIGURES)[figure].replace("per rank", f"of {rank.label}")
        series = [(rank.label, getattr(rank, figure))]
        unit = dict((f, u) for f, _, u in RANK_FIGURES)[figure] or _bytes(series)
        ranks_marks = tuple(m for f, m in marks if f == figure and m.rank == mark.rank)
        # fitted closely to the rank's own figures: the alert already says they move, the chart shows how
        charts.append(line_chart(f"{title}: {mark.rule}", series, unit, span, frozenset([rank.label]),
                                 ranks_marks, css="alerted", min_span=FOCUS_MIN_SPAN))
    for figure, title, unit in RANK_FIGURES:
        series = [(r.label, getattr(r, figure)) for r in ranks]
        if figure in ("loss", "lr") and not any(pts for _, pts in series):
            continue  # drawn only where the training reports them
        focus = frozenset(by_rank[m.rank].label for f, m in marks
                          if f == figure and m.state in SHOWN_STATES and m.rank in by_rank)
        charts.append(line_chart(title, series, unit or _bytes(series), span, focus,
                                 tuple(m for f, m in marks if f in (figure, ""))))
        if figure == "gpu_memory":
            allocator = [(f"{r.label} {name}", pts) for r in ranks
                         for name, pts in (("allocated", r.gpu_allocated), ("reserved", r.gpu_reserved)) if pts]
            if allocator:  # only where a process reports its allocator (clusterwatch.train)
                charts.append(line_chart("GPU memory as the allocator sees it per rank", allocator,
                                         _bytes(allocator), span))
    memory = [(g.label, g.memory_used) for g in gpus]
    charts.append(line_chart("GPU memory used per GPU", memory, _bytes(memory), span))
    charts.append(line_chart("GPU power per GPU", [(g.label, g.power) for g in gpus], WATTS, span))
    charts.append(line_chart("GPU utilisation", [(g.label, g.utilization) for g in gpus], PERCENT, span))
    return charts
