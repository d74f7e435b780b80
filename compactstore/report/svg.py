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


def _k(tokens: float, unit: float) -> str:
    """An axis label in the axis's one unit: thousands (``6.25k``, ``12.5k``, ``25k``) on an
    axis that reaches 10,000 tokens (``unit``), else tokens (``1,500``, ``3,000``)."""
    if unit < 10_000:
        return f"{tokens:,.0f}"
    return f"{tokens / 1000:,.2f}".rstrip("0").rstrip(".") + "k"


_MAX_LABELS = 8  # token labels on the usage chart's axis, at most


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

    x_scale, y_scale = plot_w / last, plot_h / top_tokens

    def x(seq: float) -> float:
        return round(LEFT + x_scale * seq, 1) if seq > 0 else LEFT

    def y(tokens: float) -> float:
        return round(_TOP + plot_h - y_scale * tokens, 1)

    out = [
        f'<svg id="usage-chart" class="chart" viewBox="0 0 {WIDTH} {_USAGE_HEIGHT}" '
        f'role="img" aria-label="usage per model call">',
        f'<rect class="plot" x="{LEFT}" y="{_TOP}" width="{plot_w}" height="{plot_h}"/>',
    ]
    out.append(f'<text class="axis" x="{LEFT - 6}" y="{_TOP + plot_h}" text-anchor="end">0</text>')
    # Grid lines at quarters of the window, above it too when usage went past it (a marker
    # up there still has a scale), every few quarters when there would be too many.
    quarters = int(top_tokens // (data.context_window / 4))
    every = max(1, -(-quarters // _MAX_LABELS))
    every = every if every <= 2 else -(-every // 4) * 4  # 1, 2 or whole windows
    for quarter in sorted({*range(every, quarters + 1, every), 4}):  # the window: always
        tokens = data.context_window * quarter / 4
        level = y(tokens)
        if quarter != 4:
            out.append(
                f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{level}" y2="{level}"/>'
            )
        out.append(
            f'<text class="axis" x="{LEFT - 6}" y="{level + 4}" text-anchor="end">'
            f"{_k(tokens, top_tokens)}</text>"
        )
    window, threshold = y(data.context_window), y(data.context_window * data.threshold)
    out += [
        f'<line class="window" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{window}" y2="{window}"/>',
        f'<line class="threshold" x1="{LEFT}" x2="{WIDTH - RIGHT}" '
        f'y1="{threshold}" y2="{threshold}"/>',
        f'<text class="label" x="{WIDTH - RIGHT - 4}" y="{threshold - 4}" text-anchor="end">'
        f"auto-compact at {data.threshold:.0%}</text>",
        f'<text class="axis" x="{LEFT}" y="{_USAGE_HEIGHT - 8}">seq 0</text>',
        f'<text class="axis" x="{WIDTH - RIGHT}" y="{_USAGE_HEIGHT - 8}" text-anchor="end">'
        f"seq {last:,}</text>",
    ]
    if calls:
        # The provider's count is a wide pale line under the store's, so both show where
        # they agree.
        runs: list[list[tuple[float, float]]] = [[]]
        for call in calls:
            if call.real_tokens is None:
                if runs[-1]:
                    runs.append([])
                continue
            runs[-1].append((x(call.seq), y(call.real_tokens)))
        if runs[0]:
            out.append(f'<path class="real" d="{_path(runs)}"/>')
        estimate = [(x(c.seq), y(c.usage)) for c in calls]
        out.append(f'<path class="usage" d="{_path([estimate])}"/>')
    for view in data.compactions:
        if view.on_chart:
            out.append(_marker(view, x(view.last_seq), y(view.result.tokens_before)))
    out.append(
        f'<line id="cursor" class="cursor" x1="{LEFT}" x2="{LEFT}" y1="{_TOP}" '
        f'y2="{_TOP + plot_h}"/>'
    )
    out.append("</svg>")
    return "\n".join(out)


def _path(runs: list[list[tuple[float, float]]]) -> str:
    """SVG path data of polylines, drawing per pixel column only the first, lowest, highest
    and last point (the line looks the same; 10,000 calls make a path of ~2,000 points)."""
    parts: list[str] = []
    for run in runs:
        columns: dict[int, list[tuple[float, float]]] = {}
        for point in run:  # x never decreases: a column's points are consecutive
            columns.setdefault(int(point[0]), []).append(point)
        kept: list[tuple[float, float]] = []
        for column in columns.values():
            ends = {0, len(column) - 1}
            ends.add(min(range(len(column)), key=lambda i: column[i][1]))
            ends.add(max(range(len(column)), key=lambda i: column[i][1]))
            kept += [column[i] for i in sorted(ends)]
        if kept:
            parts.append("M" + " L".join(f"{px} {py}" for px, py in kept))
    return " ".join(parts)


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
        f'<text class="axis" x="{LEFT - 6}" y="{_TOP + 8}" text-anchor="end">'
        f"{_k(biggest, biggest)}</text>",
        f'<text class="axis" x="{LEFT - 6}" y="{_TOP + plot_h}" text-anchor="end">0</text>',
    ]
    for index, item in enumerate(items):
        height = max(round(plot_h * item.tokens / biggest, 1), 1.0)
        where = "summary" if item.seq is None and item.state == "summary" else f"seq {item.seq}"
        if item.seq is None and item.state != "summary":
            where = "not in the log"
        title = " · ".join([where, item.kind, f"{item.tokens:,} tokens", item.state, *item.media])
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
