"""The report's charts as inline SVG, drawn here so the page needs nothing from outside.

Every text that reaches the markup is escaped; colours and sizes come from CSS classes and
SVG attributes (the page's Content-Security-Policy allows no ``style`` attributes).
"""

from __future__ import annotations

import re
from html import escape

from compactstore.report.data import CompactionView, ReportData

__all__ = ["LEFT", "RIGHT", "WIDTH", "context_chart", "css_name", "top_seq", "usage_chart"]

WIDTH = 1000
_USAGE_HEIGHT = 320
_CONTEXT_HEIGHT = 150
LEFT, RIGHT, _TOP, _BOTTOM = 70, 12, 12, 30


def css_name(value: str) -> str:
    """A value usable in a class name (strategy and state names are already; others not)."""
    return re.sub(r"[^a-z0-9_-]", "_", value.lower())


def _k(tokens: float) -> str:
    return f"{tokens / 1000:,.0f}k" if tokens >= 10_000 else f"{tokens:,.0f}"


def top_seq(data: ReportData) -> int:
    """The right end of the usage chart's seq axis."""
    seqs = [c.seq for c in data.calls] + [c.last_seq for c in data.compactions]
    return max([data.message_count - 1, 1, *seqs])


def usage_chart(data: ReportData) -> str:
    """Usage per model call against the window and the auto-compact threshold, by seq, with
    a marker per compaction (linked to its card or row)."""
    calls = data.calls
    last = top_seq(data)
    top_tokens = max(data.context_window, data.peak) * 1.05
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = _USAGE_HEIGHT - _TOP - _BOTTOM

    def x(seq: float) -> float:
        return round(LEFT + plot_w * max(seq, 0) / last, 1)

    def y(tokens: float) -> float:
        return round(_TOP + plot_h * (1 - tokens / top_tokens), 1)

    out = [
        f'<svg id="usage-chart" class="chart" viewBox="0 0 {WIDTH} {_USAGE_HEIGHT}" '
        f'role="img" aria-label="usage per model call">',
        f'<rect class="plot" x="{LEFT}" y="{_TOP}" width="{plot_w}" height="{plot_h}"/>',
    ]
    for share in (0.25, 0.5, 0.75):
        level = y(data.context_window * share)
        out.append(
            f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{level}" y2="{level}"/>'
        )
        out.append(
            f'<text class="axis" x="{LEFT - 6}" y="{level + 4}" text-anchor="end">'
            f"{_k(data.context_window * share)}</text>"
        )
    window, threshold = y(data.context_window), y(data.context_window * data.threshold)
    out += [
        f'<line class="window" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{window}" y2="{window}"/>',
        f'<text class="axis" x="{LEFT - 6}" y="{window + 4}" text-anchor="end">'
        f"{_k(data.context_window)}</text>",
        f'<line class="threshold" x1="{LEFT}" x2="{WIDTH - RIGHT}" '
        f'y1="{threshold}" y2="{threshold}"/>',
        f'<text class="label" x="{WIDTH - RIGHT - 4}" y="{threshold - 4}" text-anchor="end">'
        f"auto-compact at {data.threshold:.0%}</text>",
        f'<text class="axis" x="{LEFT}" y="{_USAGE_HEIGHT - 8}">seq 0</text>',
        f'<text class="axis" x="{WIDTH - RIGHT}" y="{_USAGE_HEIGHT - 8}" text-anchor="end">'
        f"seq {last:,}</text>",
    ]
    if calls:
        estimate = " L".join(f"{x(c.seq)} {y(c.usage)}" for c in calls)
        out.append(f'<path class="usage" d="M{estimate}"/>')
        real: list[str] = []
        drawing = False
        for call in calls:
            if call.real_tokens is None:
                drawing = False
                continue
            real.append(f"{'L' if drawing else 'M'}{x(call.seq)} {y(call.real_tokens)}")
            drawing = True
        if real:
            out.append(f'<path class="real" d="{" ".join(real)}"/>')
    for view in data.compactions:
        out.append(_marker(view, x(view.last_seq), y(view.result.tokens_before)))
    out.append(
        f'<line id="cursor" class="cursor" x1="{LEFT}" x2="{LEFT}" y1="{_TOP}" '
        f'y2="{_TOP + plot_h}"/>'
    )
    out.append("</svg>")
    return "\n".join(out)


def _marker(view: CompactionView, cx: float, cy: float) -> str:
    result = view.result
    classes = f"marker s-{css_name(view.strategy)}"
    if view.rolled_back:
        classes += " rolled-back"
    if not result.success:
        classes += " failed"
    title = (
        f"#{view.id} {view.strategy} ({view.trigger}) at seq {view.last_seq:,}: "
        f"{result.tokens_before:,} → {result.tokens_after:,} tokens"
        + (", rolled back" if view.rolled_back else "")
        + ("" if result.success else ", failed")
    )
    radius = 5 if view.card else 3
    return (
        f'<a href="#c{view.id}"><circle class="{classes}" cx="{cx}" cy="{cy}" r="{radius}">'
        f"<title>{escape(title)}</title></circle></a>"
    )


def context_chart(data: ReportData) -> str:
    """The active context now: one bar per message, its height the message's tokens."""
    items = data.context
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = _CONTEXT_HEIGHT - _TOP - _BOTTOM
    biggest = max([1, *(item.tokens for item in items)])
    step = plot_w / max(len(items), 1)
    width = round(max(step - (1 if step > 3 else 0), 0.5), 2)
    out = [
        f'<svg id="context-chart" class="chart" viewBox="0 0 {WIDTH} {_CONTEXT_HEIGHT}" '
        f'role="img" aria-label="the active context, one bar per message">',
        f'<text class="axis" x="{LEFT - 6}" y="{_TOP + 8}" text-anchor="end">{_k(biggest)}</text>',
        f'<text class="axis" x="{LEFT - 6}" y="{_TOP + plot_h}" text-anchor="end">0</text>',
    ]
    for index, item in enumerate(items):
        height = max(round(plot_h * item.tokens / biggest, 1), 1.0)
        where = "summary" if item.seq is None and item.state == "summary" else f"seq {item.seq}"
        if item.seq is None and item.state != "summary":
            where = "not in the log"
        title = f"{where} · {item.kind} · {item.tokens:,} tokens · {item.state}"
        out.append(
            f'<rect class="bar st-{css_name(item.state)}" x="{round(LEFT + index * step, 2)}" '
            f'y="{round(_TOP + plot_h - height, 1)}" width="{width}" height="{height}">'
            f"<title>{escape(title)}</title></rect>"
        )
    out.append(
        f'<text class="axis" x="{LEFT}" y="{_CONTEXT_HEIGHT - 8}">oldest</text>'
        f'<text class="axis" x="{WIDTH - RIGHT}" y="{_CONTEXT_HEIGHT - 8}" '
        f'text-anchor="end">newest</text>'
    )
    out.append("</svg>")
    return "\n".join(out)
