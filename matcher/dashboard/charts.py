"""Charts drawn on the server as inline SVG: no script, no library, the numbers are in the page
(every line and bar carries a title a browser shows on hover). Colours come from the style
sheet, by class."""

from __future__ import annotations

import math
from datetime import datetime
from html import escape

from taskqueue.pilots.activity import Series

WIDTH, HEIGHT = 760, 230
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 14, 30


def nice_step(value: float, lines: int = 5) -> int:
    """A step of 1, 2 or 5 times a power of ten such that ``lines`` steps reach ``value``."""
    target = max(value / lines, 1)
    power = 10 ** math.floor(math.log10(target))
    for step in (1, 2, 5, 10):
        if step * power >= target:
            return int(step * power)
    return int(10 * power)  # pragma: no cover


def _label(value: int) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if value >= 10_000:
        return f"{value / 1000:g}k"
    return f"{value:,}"


def _time_label(t: datetime, span_seconds: float) -> str:
    return t.strftime("%d %b" if span_seconds > 3 * 86400 else "%H:%M")


def line_chart(series: Series, *, title: str, classes: dict[str, str],
               start: datetime | None = None, end: datetime | None = None,
               unit: str = "jobs") -> str:
    """Lines of ``series`` (one per name, class from ``classes``) over time, on an axis from
    ``start`` to ``end`` (default: the series' own first and last times)."""
    label = escape(title)
    if not series.times:
        return (f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
                f'aria-label="{label}: no data yet"><text x="{WIDTH / 2}" y="{HEIGHT / 2}" '
                'class="empty" text-anchor="middle">No data yet: the activity loop has not '
                'recorded this period</text></svg>')
    peak = max((max(v) for v in series.lines.values() if v), default=0)
    step = nice_step(peak)
    top = max(step, math.ceil(peak / step) * step)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    t0 = min(start or series.times[0], series.times[0])
    t1 = max(end or series.times[-1], series.times[-1])
    span = max((t1 - t0).total_seconds(), 1.0)

    def x(t: datetime) -> float:
        return LEFT + plot_w * ((t - t0).total_seconds() / span)

    def y(v: float) -> float:
        return TOP + plot_h * (1 - v / top)

    parts = [f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
             f'aria-label="{label}">', f"<title>{label}</title>"]
    for value in range(0, top + 1, step):
        yy = y(value)
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{yy:.1f}" '
                     f'y2="{yy:.1f}"/>')
        parts.append(f'<text class="axis" x="{LEFT - 6}" y="{yy + 4:.1f}" text-anchor="end">'
                     f"{_label(value)}</text>")
    ticks = 6
    for i in range(ticks + 1):
        t = t0 + (t1 - t0) * i / ticks
        parts.append(f'<text class="axis" x="{x(t):.1f}" y="{HEIGHT - 10}" '
                     f'text-anchor="middle">{_time_label(t, span)}</text>')
    last = series.times[-1]
    for name, values in series.lines.items():
        css = classes.get(name, "")
        tip = escape(f"{name}: {values[-1]:,} {unit} at {_time_label(last, span)} UTC "
                     f"(peak {max(values, default=0):,})")
        if len(values) == 1:
            parts.append(f'<circle class="line {css}" data-total="{values[0]}" '
                         f'cx="{x(last):.1f}" cy="{y(values[0]):.1f}" r="3.5">'
                         f"<title>{tip}</title></circle>")
            continue
        points = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in zip(series.times, values,
                                                                      strict=True))
        parts.append(f'<polyline class="line {css}" data-total="{sum(values)}" '
                     f'points="{points}"><title>{tip}</title></polyline>')
    parts.append("</svg>")
    return "".join(parts)


def bar(fraction: float, css: str = "") -> str:
    """A small horizontal bar for tables, ``fraction`` of the cell's width (capped at 1)."""
    width = max(0.0, min(1.0, fraction)) * 100
    return (f'<svg class="bar {css}" viewBox="0 0 100 10" preserveAspectRatio="none" '
            f'aria-hidden="true"><rect class="track" width="100" height="10"/>'
            f'<rect class="fill" width="{width:.1f}" height="10"/></svg>')
