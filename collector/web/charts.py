"""Line charts as inline SVG, drawn on the server: no script, no library, nothing fetched.

Each line is an SVG polyline whose points are the series' values scaled into the plot; the figures
drawn are kept as data-values on it (for tests and for anyone reading the page's source).
"""
from __future__ import annotations

from collections.abc import Callable
from html import escape

WIDTH, HEIGHT = 560, 160
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 64, 8, 8, 20
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
MAX_POINTS = 400  # more than the plot has pixels across is wasted page weight


def _thin(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    if len(points) <= MAX_POINTS:
        return points
    step = (len(points) - 1) / (MAX_POINTS - 1)
    return [points[round(i * step)] for i in range(MAX_POINTS)]


def _figure(v: float) -> str:
    return f"{v:.12g}"


def _tick(v: float) -> str:
    return f"{v:.3g}"


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def line_chart(title: str, lines: list[tuple[str, list[tuple[float, float]]]],
               value_text: Callable[[float], str] = _tick, x_is_time: bool = True) -> str:
    """An SVG chart of `lines` ((label, [(x, y), ...]) each) sharing one x and one y axis from 0.

    Args:
        title: what the chart shows (escaped).
        lines: the series; empty ones are left out, and with none the chart says "no data yet".
        value_text: how the y axis labels its top and bottom values (bytes, percent...).
        x_is_time: x is Unix seconds (the axis says how long ago its start was); else sample numbers.
    """
    lines = [(label, _thin(pts)) for label, pts in lines if pts]
    head = (f'<figure class="chart"><figcaption>{escape(title)}</figcaption>'
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
            f'aria-label="{escape(title)}" preserveAspectRatio="none">')
    if not lines:
        return head + f'<text x="{WIDTH // 2}" y="{HEIGHT // 2}" text-anchor="middle">no data yet</text></svg></figure>'
    xs = [x for _, pts in lines for x, _ in pts]
    ys = [y for _, pts in lines for _, y in pts]
    x0, x1 = min(xs), max(xs)
    top, low = max(ys), min(ys)
    # a figure that moves little on a large base (20 GiB growing by 1 %) would draw flat from 0: the axis
    # then starts near the lowest value, and says so in its bottom label
    bottom = 0.0 if low <= 0.5 * top else low - 0.05 * (top - low)
    if top <= bottom:
        top = bottom + (abs(bottom) or 1.0)
    pw, ph = WIDTH - PAD_LEFT - PAD_RIGHT, HEIGHT - PAD_TOP - PAD_BOTTOM

    def sx(x: float) -> float:
        return PAD_LEFT + (pw * (x - x0) / (x1 - x0) if x1 > x0 else pw)

    def sy(y: float) -> float:
        return PAD_TOP + ph * (1 - (y - bottom) / (top - bottom))

    parts = [head,
             f'<line class="axis" x1="{PAD_LEFT}" y1="{PAD_TOP + ph}" x2="{WIDTH - PAD_RIGHT}" y2="{PAD_TOP + ph}"/>',
             f'<line class="axis" x1="{PAD_LEFT}" y1="{PAD_TOP}" x2="{PAD_LEFT}" y2="{PAD_TOP + ph}"/>',
             f'<text class="tick" x="{PAD_LEFT - 4}" y="{PAD_TOP + 10}" text-anchor="end">'
             f'{escape(value_text(top))}</text>',
             f'<text class="tick" x="{PAD_LEFT - 4}" y="{PAD_TOP + ph}" text-anchor="end">'
             f'{escape(value_text(bottom))}</text>']
    span = f"{_ago(x1 - x0)} ago" if x_is_time else f"sample {x0:.0f}"
    parts.append(f'<text class="tick" x="{PAD_LEFT}" y="{HEIGHT - 4}">{escape(span)}</text>')
    parts.append(f'<text class="tick" x="{WIDTH - PAD_RIGHT}" y="{HEIGHT - 4}" text-anchor="end">'
                 f'{"latest" if x_is_time else f"sample {x1:.0f}"}</text>')
    legend = []
    for i, (label, pts) in enumerate(lines):
        colour = COLOURS[i % len(COLOURS)]
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        values = " ".join(_figure(y) for _, y in pts)
        parts.append(f'<polyline class="series" fill="none" stroke="{colour}" stroke-width="1.5" '
                     f'data-label="{escape(label)}" data-values="{values}" points="{coords}"/>')
        legend.append(f'<span class="key" style="color:{colour}">━ {escape(label)}</span>')
    parts.append("</svg>")
    return "".join(parts) + f'<div class="legend">{" ".join(legend)}</div></figure>'
