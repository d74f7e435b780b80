"""The report's charts as inline SVG, drawn here so the page needs nothing from outside.

Every text that reaches the markup is escaped; colours and sizes come from CSS classes and
SVG attributes (the page's Content-Security-Policy allows no ``style`` attributes).
"""

from __future__ import annotations

import re
from html import escape

from compactstore.db.model_calls import ModelCall
from compactstore.report.data import CompactionView, ReportData

__all__ = [
    "COST_RIGHT",
    "LEFT",
    "RIGHT",
    "WIDTH",
    "cache_chart",
    "context_chart",
    "cost_chart",
    "css_name",
    "top_seq",
    "usage_chart",
]

WIDTH = 1000
_USAGE_HEIGHT = 320
_CONTEXT_HEIGHT = 150
_COST_HEIGHT = 220
LEFT, RIGHT, _TOP, _BOTTOM = 70, 12, 12, 30
COST_RIGHT = 70  # the cumulative cost's axis is on the right


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


# -- what the model calls cost ------------------------------------------------------------------


def usd(value: float | None) -> str:
    """Dollars with four decimals under a dollar, two from there (``$0.0123``, ``$12.34``)."""
    if value is None:
        return "no price"
    return f"${value:,.4f}" if abs(value) < 1 else f"${value:,.2f}"


def _columns(data: ReportData, right: int) -> tuple[list[tuple[float, list[ModelCall]]], float]:
    """The calls with a ledger grouped by the pixel column their seq falls in (a long
    session draws one bar per column, its calls averaged), and the bar width."""
    plot_w = WIDTH - LEFT - right
    x_scale = plot_w / top_seq(data)
    columns: dict[int, tuple[float, list[ModelCall]]] = {}
    for call in data.ledger_calls:
        px = round(LEFT + x_scale * max(call.seq, 0), 1)
        columns.setdefault(int(px), (px, []))[1].append(call)
    found = list(columns.values())
    width = round(max(1.0, min(12.0, 0.8 * plot_w / max(len(found), 1))), 1)
    return found, width


def cache_chart(data: ReportData) -> str:
    """Each model call's prompt by how it was billed, stacked: cache reads at the bottom,
    cache writes, then uncached input (calls averaged per pixel column)."""
    columns, width = _columns(data, RIGHT)
    plot_h = _COST_HEIGHT - _TOP - _BOTTOM
    means = []
    for px, calls in columns:
        kinds = [
            sum(getattr(c.ledger, name) for c in calls) / len(calls)
            for name in ("cache_read_tokens", "cache_write_tokens", "input_tokens")
        ]
        means.append((px, kinds))
    highest = max([1.0, *(sum(kinds) for _, kinds in means)]) * 1.05
    out = _axes("cache-chart", "each model call's prompt by how it was billed", data, RIGHT)
    out.append(
        f'<text class="axis" x="{LEFT - 6}" y="{_TOP + 8}" text-anchor="end">'
        f"{_k(highest, highest)}</text>"
    )
    for px, kinds in means:
        base = 0.0
        for name, tokens in zip(("read", "write", "uncached"), kinds, strict=True):
            if tokens <= 0:
                continue
            top = _TOP + plot_h - plot_h * (base + tokens) / highest
            height = max(round(plot_h * tokens / highest, 1), 0.5)
            out.append(
                f'<rect class="kind k-{name}" x="{round(px - width / 2, 1)}" '
                f'y="{round(top, 1)}" width="{width}" height="{height}"/>'
            )
            base += tokens
    out.append("</svg>")
    return "\n".join(out)


def cost_chart(data: ReportData) -> str:
    """Each model call's cost (bars, left axis), the cumulative cost (line, right axis),
    and a marker per compaction at the call that wrote the cache again after it, at the
    price of that rewrite (linked to its card or row)."""
    columns, width = _columns(data, COST_RIGHT)
    plot_h = _COST_HEIGHT - _TOP - _BOTTOM
    per_call: list[tuple[float, float | None]] = []
    cumulative: list[tuple[float, float]] = []
    total = 0.0
    for px, calls in columns:
        priced = [c.cost_usd for c in calls if c.cost_usd is not None]
        per_call.append((px, sum(priced) / len(priced) if priced else None))
        total += sum(priced)
        cumulative.append((px, total))
    rewrites = [view for view in data.rewrites if view.rewrite is not None]
    marked = [v.rewrite.cost_usd or 0.0 for v in rewrites if v.rewrite is not None]
    highest = max([1e-9, *(c for _, c in per_call if c is not None), *marked]) * 1.1
    overall = max(total, 1e-9) * 1.05

    def y(value: float, scale: float) -> float:
        return round(_TOP + plot_h - plot_h * value / scale, 1)

    out = _axes("cost-chart", "each model call's cost and the cumulative cost", data, COST_RIGHT)
    out += [
        f'<text class="axis" x="{LEFT - 6}" y="{_TOP + 8}" text-anchor="end">'
        f"{escape(usd(highest))}</text>",
        f'<text class="axis cumulative-axis" x="{WIDTH - COST_RIGHT + 6}" y="{_TOP + 8}">'
        f"{escape(usd(overall))}</text>",
        f'<text class="axis" x="{WIDTH - COST_RIGHT + 6}" y="{_TOP + plot_h}">$0</text>',
    ]
    for px, cost in per_call:
        if cost is None:
            continue
        height = max(round(plot_h * cost / highest, 1), 0.5)
        out.append(
            f'<rect class="cost-bar" x="{round(px - width / 2, 1)}" '
            f'y="{round(_TOP + plot_h - height, 1)}" width="{width}" height="{height}"/>'
        )
    if cumulative:
        points = [(px, y(value, overall)) for px, value in cumulative]
        out.append(f'<path class="cumulative" d="{_path([points])}"/>')
    x_scale = (WIDTH - LEFT - COST_RIGHT) / top_seq(data)
    for view in rewrites:
        rewrite = view.rewrite
        assert rewrite is not None
        cx = round(LEFT + x_scale * max(rewrite.call_seq, 0), 1)
        cy = y(rewrite.cost_usd or 0.0, highest)
        title = (
            f"#{view.id} {view.strategy}: the call at seq {rewrite.call_seq:,} wrote "
            f"{rewrite.tokens:,} tokens to the cache again, {usd(rewrite.cost_usd)}"
        )
        out.append(
            f'<a href="#c{view.id}"><circle class="rewrite s-{css_name(view.strategy)}" '
            f'cx="{cx}" cy="{cy}" r="4"><title>{escape(title)}</title></circle></a>'
        )
    out.append("</svg>")
    return "\n".join(out)


def _axes(chart_id: str, label: str, data: ReportData, right: int) -> list[str]:
    plot_w, plot_h = WIDTH - LEFT - right, _COST_HEIGHT - _TOP - _BOTTOM
    return [
        f'<svg id="{chart_id}" class="chart" viewBox="0 0 {WIDTH} {_COST_HEIGHT}" role="img" '
        f'aria-label="{label}">',
        f'<rect class="plot" x="{LEFT}" y="{_TOP}" width="{plot_w}" height="{plot_h}"/>',
        f'<text class="axis" x="{LEFT - 6}" y="{_TOP + plot_h}" text-anchor="end">0</text>',
        f'<text class="axis" x="{LEFT}" y="{_COST_HEIGHT - 8}">seq 0</text>',
        f'<text class="axis" x="{WIDTH - right}" y="{_COST_HEIGHT - 8}" text-anchor="end">'
        f"seq {top_seq(data):,}</text>",
    ]
