"""``compactstore report``: one self-contained HTML page per session.

The page shows the usage curve per model call (``model_calls``) against the window and the
auto-compact threshold with a marker per compaction; what the calls cost (the totals, the
cost per call and cumulative, each call's prompt as cache reads, cache writes and uncached
input, and the cache each compaction made the provider write again); a card per
compaction that cut or recovered the context (what was lost, the summary and what changed
in it), one line per other compaction, the active context now, and the circuit breaker.

It loads nothing and runs nothing it did not bring: charts are inline SVG drawn by
:mod:`compactstore.report.svg`, everything from a conversation is escaped by Jinja2's
autoescape, the script's data is a JSON block with ``<``, ``>``, ``&``, U+2028 and U+2029
escaped, and a Content-Security-Policy (``default-src 'none'``) allows only the page's own
inline script and style, by hash.

Jinja2 is the optional extra ``report`` (``pip install 'compactstore[report]'``), imported
only here, when a page is written.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import re
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compactstore.errors import InvalidInputError, MissingExtraError
from compactstore.models import CompactStrategy
from compactstore.report.data import ReportData, as_json, collect

if TYPE_CHECKING:
    import jinja2

    from compactstore._store.store import CompactStore

__all__ = [
    "ReportData",
    "Writer",
    "collect",
    "render",
    "safe_filename",
    "session_page",
    "write_all",
    "write_report",
]

_STATES = ("pinned", "summary", "original", "persisted", "cleared", "deduplicated", "synthetic")
_JSON_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}


def _environment() -> jinja2.Environment:
    """The templates; a missing Jinja2 is an error naming the extra."""
    try:
        import jinja2  # noqa: F401
    except ImportError:
        raise MissingExtraError(
            "writing a report needs Jinja2, the 'report' extra: pip install 'compactstore[report]'"
        ) from None
    return _compiled()


@functools.cache
def _compiled() -> jinja2.Environment:
    """The templates, compiled once per process."""
    import jinja2

    return jinja2.Environment(
        loader=jinja2.PackageLoader("compactstore.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )


def _static(name: str) -> str:
    return files("compactstore.report").joinpath("static", name).read_text(encoding="utf-8")


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode()


def script_json(value: Any) -> str:
    """JSON that is safe inside a ``<script>`` element and in any JavaScript parser."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return re.sub("[<>&\u2028\u2029]", lambda m: _JSON_ESCAPES[m.group()], text)


def content_security_policy(script: str | None, style: str) -> str:
    """Nothing may load; only the given inline script and style (by hash) may apply."""
    scripts = f"'{_sha256(script)}'" if script is not None else "'none'"
    return (
        f"default-src 'none'; script-src {scripts}; style-src '{_sha256(style)}'; "
        "img-src 'none'; base-uri 'none'; form-action 'none'"
    )


def _number(value: float) -> str:
    return f"{value:,}"


def _percent(part: float, whole: float) -> str:
    return f"{part / whole:.0%}" if whole else "–"


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "–"
    try:
        return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return f"{epoch:.0f}"


def _ranges(seqs: Iterable[int]) -> str:
    """1, 2, 3, 7, 9, 10 -> "1–3, 7, 9–10"."""
    parts: list[str] = []
    ordered = sorted(seqs)
    start = previous = ordered[0] if ordered else 0
    for seq in [*ordered[1:], None]:
        if seq is not None and seq == previous + 1:
            previous = seq
            continue
        parts.append(str(start) if start == previous else f"{start}–{previous}")
        if seq is not None:
            start = previous = seq
    return ", ".join(parts) if ordered else ""


def _filters() -> dict[str, Callable[..., str]]:
    from compactstore.report.svg import css_name, usd

    return {
        "n": _number,
        "pct": _percent,
        "when": _when,
        "ranges": _ranges,
        "css": css_name,
        "usd": usd,
    }


def render(data: ReportData, *, written_at: float | None = None) -> str:
    """The HTML page of one session's report.

    Raises:
        MissingExtraError: Jinja2 (the ``report`` extra) is not installed.
    """
    from compactstore import __version__
    from compactstore.report.svg import (
        COST_RIGHT,
        LEFT,
        RIGHT,
        WIDTH,
        cache_chart,
        context_chart,
        cost_chart,
        top_seq,
        usage_chart,
    )

    environment = _environment()
    script, style = _static("report.js"), _static("report.css")
    numbers = {
        **as_json(data),
        "x0": LEFT,
        "x1": WIDTH - RIGHT,
        "cost_x1": WIDTH - COST_RIGHT,
        "top_seq": top_seq(data),
    }
    return environment.get_template("session.html").render(
        d=data,
        csp=content_security_policy(script, style),
        style=_markup(style),
        script=_markup(script),
        data_json=_markup(script_json(numbers)),
        usage_chart=_markup(usage_chart(data)),
        context_chart=_markup(context_chart(data)),
        cost_chart=_markup(cost_chart(data)) if data.ledger_calls else None,
        cache_chart=_markup(cache_chart(data)) if data.ledger_calls else None,
        strategies=sorted(
            {c.strategy for c in data.compactions if c.on_chart}, key=_strategy_order
        ),
        states=[s for s in _STATES if any(item.state == s for item in data.context)],
        version=__version__,
        written_at=time.time() if written_at is None else written_at,
        **_filters(),
    )


def _strategy_order(name: str) -> tuple[int, str]:
    names = [s.value for s in CompactStrategy]
    return (names.index(name) if name in names else len(names), name)


def session_page(store: CompactStore, session_id: str) -> str:
    """The HTML page of one session's report.

    Raises:
        NotFoundError: there is no such session.
        MissingExtraError: Jinja2 (the ``report`` extra) is not installed.
    """
    _environment()  # fail on a missing extra before reading anything
    return render(collect(store, session_id))


def write_report(store: CompactStore, session_id: str, path: str | Path | None = None) -> Path:
    """Write one session's report; returns the file written.

    ``path`` defaults to the session's safe file name in the current directory.

    Raises:
        NotFoundError: there is no such session.
        MissingExtraError: Jinja2 (the ``report`` extra) is not installed.
        InvalidInputError: the file cannot be written.
    """
    page = session_page(store, session_id)
    target = Path(path) if path is not None else Path(safe_filename(session_id))
    _write(target, page.encode("utf-8"))
    return target


Writer = Callable[[Path, bytes], None]


def write_all(
    store: CompactStore,
    directory: str | Path,
    *,
    progress: Callable[[int, int], None] | None = None,
    write: Writer | None = None,
) -> Path:
    """Write ``DIRECTORY/index.html`` and one page per session; returns the index.

    Pages are named by :func:`safe_filename`, so no session id can reach outside the
    directory or collide with the index. ``write(path, data)`` writes each file (default:
    a plain write).

    Raises:
        MissingExtraError: Jinja2 (the ``report`` extra) is not installed.
        InvalidInputError: the directory or a file cannot be written.
    """
    environment = _environment()
    put = write or _write
    folder = Path(directory)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInputError(f"cannot create {folder}: {exc.strerror or exc}") from None
    sessions = store.sessions()
    rows: list[dict[str, Any]] = []
    for done, info in enumerate(sessions, start=1):
        data = collect(store, info.id)
        name = safe_filename(info.id)
        put(folder / name, render(data).encode("utf-8"))
        rows.append(
            {
                "id": data.session_id,
                "file": name,
                "format": data.format,
                "messages": data.message_count,
                "calls": len(data.calls),
                "compactions": len(data.compactions),
                "cuts": len(data.cards),
                "usage": data.usage,
                "window": data.context_window,
                "tripped": data.breaker.tripped,
            }
        )
        if progress is not None:
            progress(done, len(sessions))
    style = _static("report.css")
    index = environment.get_template("index.html").render(
        rows=rows,
        location=store.location,
        csp=content_security_policy(None, style),
        style=_markup(style),
        written_at=time.time(),
        **_filters(),
    )
    put(folder / "index.html", index.encode("utf-8"))
    return folder / "index.html"


def _markup(text: str) -> Any:
    from markupsafe import Markup

    return Markup(text)


def safe_filename(session_id: str) -> str:
    """A file name for a session's page: ``ID.html`` for an id of lower-case letters,
    digits, ``-`` and ``_`` (``demo.html``); for any other id its letters, digits, ``-`` and
    ``_``, then a hash of the whole id (ids may hold ``/``, ``..`` or differ only in case,
    which a case-insensitive file system would not tell apart)."""
    if _PLAIN_ID.fullmatch(session_id) and session_id != "index":  # (index.html: --all's)
        return f"{session_id}.html"
    readable = re.sub(r"[^A-Za-z0-9_-]+", "_", session_id).strip("_")[:60] or "session"
    digest = hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{readable}-{digest}.html"


# An id that is a file name as it is, on every file system (see safe_filename).
_PLAIN_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,59}", re.ASCII)


def _write(path: Path, data: bytes) -> None:
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise InvalidInputError(f"cannot write {path}: {exc.strerror or exc}") from None
