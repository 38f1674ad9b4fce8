"""Line charts as data for templates/chart.html, which draws them as inline SVG: no script, no library.

The geometry is computed here (scales, ticks, points); the template only writes it out, escaped. Each line
keeps the figures it draws as data-values (for tests, and for anyone reading the page's source), and each
alert mark the times it spans as data-start and data-end.

The axes are meant to be read at a glance: time of day along x, the same span for every chart of a page
(Span); round figures in the chart's unit up y (Unit). A y axis starts at 0 unless its figures sit far
from 0, and even then it spans at least MIN_SPAN of its top value, so that a few per cent of jitter is
drawn as the wobble it is, not as a fall to the bottom of the chart.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

WIDTH, HEIGHT = 560, 180
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 62, 10, 16, 20
COLOURS = ("#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#bcbd22")
FOCUS_COLOUR = "#d62728"  # the alert's rank: the one red line, other ranks greyed behind it
OTHER_COLOUR = "#b8bec6"
MAX_POINTS = 400  # more than the plot has pixels across is wasted page weight
MIN_SPAN = 0.1
Series = list[tuple[float, float]]


@dataclass(frozen=True, slots=True)
class Unit:
    """How a chart's figures read: `scale` divides them into `name` (bytes into GiB); `fixed_top`: the axis
    always reaches it (100 for a utilisation); `zoom`: the axis may start above 0 where the figures sit far
    from it (memory: a leak on a large base), else it always starts at 0; `text`: a figure as a tick label."""

    name: str
    scale: float = 1.0
    fixed_top: float | None = None
    text: Callable[[float], str] | None = None
    zoom: bool = False

    def label(self, v: float) -> str:
        if self.text is not None:
            return self.text(v)
        return f"{v:.3g}{' ' + self.name if self.name else ''}"


PERCENT = Unit("%", fixed_top=100, text=lambda v: f"{v:.0f}%")
CPU_PERCENT = Unit("%", fixed_top=100, text=lambda v: f"{v:.0f}%")  # may pass 100: one core each 100
STEPS = Unit("steps/s", text=lambda v: f"{v:.3g}")
WATTS = Unit("W", text=lambda v: f"{v:.0f} W")
PLAIN = Unit("", zoom=True)
RATE = Unit("", text=lambda v: f"{v:.2g}")  # a learning rate: 3e-04


def bytes_unit(top: float) -> Unit:
    """GiB for figures of a GiB or more, else MiB."""
    return Unit("GiB", 2.0**30, zoom=True) if top >= 2**30 else Unit("MiB", 2.0**20, zoom=True)


@dataclass(frozen=True, slots=True)
class Span:
    """The time every chart of a page shows, in Unix seconds; `start` None: charts whose x is a sample's
    index (an ended job's summary), not a time."""

    start: float | None
    end: float


@dataclass(frozen=True, slots=True)
class Mark:
    """An alert's time on a chart: from `start` (it went pending, or fired) to `end` (resolved; None: still
    on), its rule and rank for the label."""

    rule: str
    start: float
    end: float | None
    rank: int | None
    state: str
    fired: float = 0.0


@dataclass(slots=True)
class Line:
    label: str
    colour: str
    width: float
    role: str  # "focus" (the alert's rank), "other" (greyed behind it) or "series" (no focus on the chart)
    points: str
    values: str
    times: str


@dataclass(slots=True)
class MarkShape:
    rule: str
    rank: str
    state: str
    start: float
    end: float
    x0: float
    x1: float
    fired_x: float | None
    text: str


@dataclass(slots=True)
class Chart:
    """What templates/chart.html draws."""

    title: str
    unit: str
    width: int = WIDTH
    height: int = HEIGHT
    plot: tuple[float, float, float, float] = (PAD_LEFT, PAD_TOP, WIDTH - PAD_RIGHT, HEIGHT - PAD_BOTTOM)
    x_ticks: list[tuple[float, str]] = field(default_factory=list)
    y_ticks: list[tuple[float, str]] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    marks: list[MarkShape] = field(default_factory=list)
    legend: list[tuple[str, str]] = field(default_factory=list)  # (colour, text)
    empty: str = ""
    span: tuple[float, float] = (0.0, 0.0)
    focus: bool = False
    css: str = ""


def _thin(points: Series) -> Series:
    if len(points) <= MAX_POINTS:
        return points
    step = (len(points) - 1) / (MAX_POINTS - 1)
    return [points[round(i * step)] for i in range(MAX_POINTS)]


def nice_step(span: float, count: int) -> float:
    """A round step (1, 2, 2.5 or 5 times a power of ten) giving about `count` ticks over `span`."""
    raw = span / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * power >= raw:
            return m * power
    return 10 * power


def y_range(values: list[float], unit: Unit, min_span: float = MIN_SPAN) -> tuple[float, float, float]:
    """(bottom, top, tick step) in the unit's figures: from 0 unless the unit zooms and the figures sit far
    above it, spanning at least MIN_SPAN of the top, rounded out to whole steps."""
    top, low = max(values), min(values)
    if unit.fixed_top is not None:
        top = max(top, unit.fixed_top)
    bottom = low if unit.zoom and low > 0.5 * top else 0.0
    span = max(top - bottom, abs(top) * min_span, 1e-12 if top == 0 else 0.0)
    if top - bottom < span:  # widen around the figures, never below 0 for figures at or above it
        middle = (top + bottom) / 2
        bottom, top = max(0.0, middle - span / 2) if bottom >= 0 else middle - span / 2, middle + span / 2
        top = max(top, bottom + span)
    if top <= bottom:
        top = bottom + 1.0
    step = nice_step(top - bottom, 4)
    return math.floor(bottom / step + 1e-9) * step, math.ceil(top / step - 1e-9) * step, step


def _time_step(span_s: float) -> float:
    for step in (5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400):
        if span_s / step <= 6:
            return step
    return 86400.0


def time_ticks(start: float, end: float) -> list[tuple[float, str]]:
    """Ticks at round times of day (local time, as the page's other times) across [start, end]."""
    step = _time_step(end - start)
    offset = -time.localtime(start).tm_gmtoff  # round in local time: ticks at 14:00, not at 14:00 UTC
    first = math.ceil((start - offset) / step) * step + offset
    fmt = "%H:%M:%S" if step < 60 else "%H:%M"
    ticks, t = [], first
    while t <= end + 1e-6:
        ticks.append((t, time.strftime(fmt, time.localtime(t))))
        t += step
    return ticks


def line_chart(title: str, lines: list[tuple[str, Series]], unit: Unit = PLAIN, span: Span | None = None,
               focus: frozenset[str] = frozenset(), marks: tuple[Mark, ...] = (), css: str = "",
               min_span: float = MIN_SPAN) -> Chart:
    """A chart of `lines` ((label, [(x, y), ...]) each) on one x and one y axis.

    Args:
        title: what the chart shows.
        lines: the series; empty ones are left out, and with none the chart says "no data yet".
        unit: how its figures read (bytes_unit(), PERCENT...).
        span: the times it shows (every chart of a page alike); None: from its first point to its last.
        focus: the labels of the lines an alert is about: drawn red and on top, the others grey.
        marks: alerts' times, shaded across the plot with their rule.
        css: extra classes of the figure.
        min_span: the least share of its top value the y axis spans (MIN_SPAN: jitter stays a wobble).
    """
    chart = Chart(title, unit.name, css=css, focus=bool(focus))
    lines = [(label, pts) for label, pts in lines if pts]
    timed = span is None or span.start is not None
    if span is not None and span.start is not None:
        x0, x1 = span.start, span.end
        chart.span = (x0, x1)  # an empty chart too: it shows that span, with nothing in it
        lines = [(label, [(x, y) for x, y in pts if x0 <= x <= x1]) for label, pts in lines]
        lines = [(label, pts) for label, pts in lines if pts]
    elif lines:
        x0 = min(pts[0][0] for _, pts in lines)
        x1 = max(pts[-1][0] for _, pts in lines)
    if not lines:
        chart.empty = "no data yet"
        return chart
    lines = [(label, _thin(pts)) for label, pts in lines]
    if x1 <= x0:
        x1 = x0 + 1.0
    chart.span = (x0, x1)
    left, top_px, right, bottom_px = chart.plot
    pw, ph = right - left, bottom_px - top_px
    values = [y / unit.scale for _, pts in lines for _, y in pts]
    low, high, step = y_range(values, unit, min_span)

    def sx(x: float) -> float:
        return left + pw * (x - x0) / (x1 - x0)

    def sy(v: float) -> float:
        return bottom_px - ph * (v - low) / (high - low)

    n = round((high - low) / step)
    chart.y_ticks = [(sy(low + i * step), unit.label(low + i * step)) for i in range(n + 1)]
    if timed:
        chart.x_ticks = [(sx(t), text) for t, text in time_ticks(x0, x1)]
    else:
        chart.x_ticks = [(left, "earlier"), (right, "at the end")]
    ordered = sorted(lines, key=lambda item: item[0] in focus)  # the focus last: drawn on top
    colour_of = {label: COLOURS[i % len(COLOURS)] for i, (label, _) in enumerate(lines)}
    for label, pts in ordered:
        role = ("focus" if label in focus else "other") if focus else "series"
        colour = FOCUS_COLOUR if role == "focus" else OTHER_COLOUR if role == "other" else colour_of[label]
        chart.lines.append(Line(
            label, colour, 2.5 if role == "focus" else 1.2 if role == "other" else 1.6, role,
            points=" ".join(f"{sx(x):.1f},{sy(y / unit.scale):.1f}" for x, y in pts),
            values=" ".join(f"{y:.12g}" for _, y in pts),
            times=" ".join(f"{x:.3f}" for x, _ in pts)))
    if focus:
        chart.legend = [(FOCUS_COLOUR, label) for label, _ in lines if label in focus]
        others = [label for label, _ in lines if label not in focus]
        if others:
            chart.legend.append((OTHER_COLOUR, others[0] if len(others) == 1 else f"{len(others)} others"))
    else:
        chart.legend = [(colour_of[label], label) for label, _ in lines]
    if timed:
        for m in marks:
            end = m.end if m.end is not None else x1
            if end < x0 or m.start > x1:
                continue
            fired_x = sx(m.fired) if x0 <= m.fired <= x1 else None
            who = f" rank {m.rank}" if m.rank is not None else ""
            chart.marks.append(MarkShape(
                m.rule, "" if m.rank is None else str(m.rank), m.state, m.start, end,
                sx(max(m.start, x0)), sx(min(end, x1)), fired_x,
                f"{m.rule}{who}" + (f" fired {time.strftime('%H:%M:%S', time.localtime(m.fired))}" if m.fired else "")))
    return chart
