"""The job page's charts as data and as the SVG the page carries: axes a person reads, one span for every
chart, the alert's rank put forward and its time marked, stalls as falls to zero, jitter as jitter."""
from __future__ import annotations

import re
import time

import pytest
from clusterwatch.collector.web.charts import PERCENT, STEPS, Span, bytes_unit, line_chart, time_ticks, y_range
from clusterwatch.collector.web.history import GpuCharts, RankCharts, progress_rates
from clusterwatch.collector.web.job_charts import job_charts
from clusterwatch.collector.web.pages import job_page
from clusterwatch.v1 import query_pb2
from markupsafe import escape

GIB = 2**30
NOW = 1_700_000_000.0


def _ys(chart, label: str) -> list[float]:
    (line,) = [x for x in chart.lines if x.label == label]
    return [float(p.split(",")[1]) for p in line.points.split()]


def test_a_stalled_rank_falls_to_zero_where_its_step_last_moved_and_stays_there():
    reports = [(NOW + i * 0.1, i) for i in range(600)]  # 10 steps/s for a minute
    stalled_since = NOW + 59.9
    rates = progress_rates(reports, stalled_since, NOW + 120)
    assert rates[-2:] == [(stalled_since, 0.0), (NOW + 120, 0.0)]
    assert all(r == pytest.approx(10, rel=0.05) for _, r in rates[:-2])
    assert progress_rates(reports, None, NOW + 120)[-1][1] == pytest.approx(10, rel=0.05)  # no stall: no fall


def test_jittered_reports_are_drawn_as_a_steady_rate_not_as_falls():
    import random

    rng = random.Random(7)
    t, reports = NOW, []
    for step in range(1200):  # 10 steps/s, each report 0-60 ms late or early
        t += 0.1 + rng.uniform(-0.06, 0.06)
        reports.append((t, step))
    rates = [r for _, r in progress_rates(reports, None, t)]
    assert min(rates) > 8 and max(rates) < 12


def test_jitter_on_a_large_base_stays_a_wobble_and_a_leak_fills_the_chart():
    span = Span(NOW, NOW + 100)
    jitter = [(NOW + i, 20 * GIB * (1 + (0.003 if i % 2 else -0.003))) for i in range(100)]
    leak = [(NOW + i, 20 * GIB + i * 30 * 2**20) for i in range(100)]  # 3 GiB on 20
    chart = line_chart("m", [("rank 0", jitter), ("rank 1", leak)], bytes_unit(23 * GIB), span)
    plot_height = chart.plot[3] - chart.plot[1]
    wobble = _ys(chart, "rank 0")
    assert max(wobble) - min(wobble) < plot_height / 5
    grown = _ys(chart, "rank 1")
    assert grown[0] - grown[-1] > plot_height / 2
    alone = line_chart("m", [("rank 0", jitter)], bytes_unit(20 * GIB), span)  # alone on its axis: still calm
    assert max(_ys(alone, "rank 0")) - min(_ys(alone, "rank 0")) < plot_height / 5


def test_axes_read_in_round_figures_of_their_unit_and_times_of_day():
    low, high, step = y_range([20.1, 22.9], bytes_unit(23 * GIB))
    assert (low, high) == (20, 23) and step in (0.5, 1)
    assert y_range([40, 60], PERCENT)[:2] == (0, 100)  # a utilisation always from 0 to 100
    assert y_range([7.5, 9.6], STEPS)[0] == 0  # a rate from 0: a fall to 0 reads as one
    chart = line_chart("m", [("r", [(NOW, 20 * GIB), (NOW + 60, 21 * GIB)])], bytes_unit(21 * GIB),
                       Span(NOW, NOW + 600))
    assert all(text.endswith(" GiB") for _, text in chart.y_ticks)
    ticks = time_ticks(NOW, NOW + 600)
    assert all(re.fullmatch(r"\d\d:\d\d", text) for _, text in ticks) and len(ticks) >= 3
    assert all(time.localtime(t).tm_sec == 0 and time.localtime(t).tm_min % 2 == 0 for t, _ in ticks)
    assert line_chart("m", [("r", [])]).empty == "no data yet"


def _job(*alerts: dict) -> tuple[query_pb2.JobView, list[RankCharts], list[GpuCharts]]:
    view = query_pb2.JobView(now=NOW + 600)
    view.job.job_id, view.job.state = "9", "RUNNING"
    for a in alerts:
        view.alerts.add(severity="critical", description="d", **a)
    ranks = []
    for r in range(4):
        rc = RankCharts(f"rank {r}", r)
        rc.gpu_memory = [(NOW + i * 5, 20 * GIB + (i * 2**24 if r == 1 else 0)) for i in range(121)]
        rc.steps_per_s = [(NOW + i * 5, 10.0) for i in range(60)]
        rc.loss = [(NOW + i * 5, 1.0) for i in range(121)]
        ranks.append(rc)
    gpus = [GpuCharts("GPU 0 on n", utilization=[(NOW + i * 5, 90.0) for i in range(10, 121)])]
    return view, ranks, gpus


def test_the_alerts_rank_is_put_forward_and_its_time_marked_on_one_span():
    leak = {"rule": "gpu_memory_leak", "state": "firing", "rank": 1, "since": NOW + 300, "fired_at": NOW + 330}
    view, ranks, gpus = _job(leak)
    charts = {c.title: c for c in job_charts(view, ranks, gpus, stored=False)}
    first = next(iter(charts))
    assert first == "GPU memory of rank 1: gpu_memory_leak"  # its own chart, first
    memory = charts["GPU memory per rank"]
    assert [(x.label, x.role) for x in memory.lines][-1] == ("rank 1", "focus")  # drawn last: on top
    assert {x.role for x in memory.lines[:-1]} == {"other"}
    (mark,) = memory.marks
    left, _, right, _ = memory.plot
    assert mark.x0 == pytest.approx(left + (right - left) * 300 / 600) and mark.start == NOW + 300
    assert mark.fired_x == pytest.approx(left + (right - left) * 330 / 600) and mark.end == NOW + 600
    assert not charts["Steps per second per rank"].focus  # not what the alert is about
    assert {c.span for c in charts.values()} == {(NOW, NOW + 600)}  # one span, the longest series' start
    assert "Learning rate per rank" not in charts  # lr is drawn only where reported
    short = job_charts(view, ranks, gpus, stored=False, range_key="5m")
    assert {c.span for c in short if not c.empty} == {(NOW + 300, NOW + 600)}


def test_hostile_text_in_a_chart_is_text():
    evil = "<script>alert(1)</script>\"'&"
    view, ranks, gpus = _job({"rule": "r" + evil, "state": "firing", "rank": 1, "since": NOW + 10})
    ranks[0].label = "l" + evil
    gpus[0].label = "g" + evil
    page = job_page(view, "", ranks, gpus, stored=False)
    assert "<script>alert" not in page and "\"'&<" not in page
    for text in ("l" + evil, "g" + evil, "r" + evil):
        assert escape(text) in page
