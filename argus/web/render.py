"""Templates and Markdown for the web page: everything shown is escaped unless this module made it HTML.

Jinja2 autoescapes every value. The one HTML we make ourselves is a report's Markdown, rendered by
markdown-it-py with raw HTML off and images off, links only to http(s) pages (with rel=noopener), so a log
line quoted in a report can never become markup, script or a link to a `javascript:` URL.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markdown_it import MarkdownIt
from markupsafe import Markup, escape

from core.names import entrypoint_of, label_of

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"
_LINK_SCHEMES = ("http://", "https://")


def _markdown() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.enable("table")
    md.disable("image")
    # Relative links and anchors stay (a report may point inside itself); any scheme but http(s) is dropped.
    md.validateLink = (  # type: ignore[method-assign]  # markdown-it's hook is this instance attribute
        lambda url: ":" not in url.split("/", 1)[0] or url.lower().startswith(_LINK_SCHEMES))

    def link_open(renderer: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
        tokens[idx].attrSet("rel", "nofollow noopener noreferrer")
        return renderer.renderToken(tokens, idx, options, env)

    md.add_render_rule("link_open", link_open)
    return md


_MD = _markdown()


def markdown_html(text: str) -> Markup:
    """A report's Markdown as HTML that holds no markup of the text's own."""
    return Markup(_MD.render(text))


def when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value else "—"


def short(value: Any, n: int = 12) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= n else text[:n] + "…"


def plain(value: Any) -> str:
    """A value as JSON text, to be escaped like any other text (Jinja's tojson is for script contexts)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


SPARK_W, SPARK_H, SPARK_PAD = 260, 56, 4
MAX_SPARK_POINTS = 200


def sparkline(points: Any, series: Any = "") -> Markup:
    """A small inline SVG of a training series' recent values (a finding's attrs["recent"]: [[step, value], ...],
    a value NaN or Inf given as text): a line through the finite values, a red mark at the top for each value that
    is not. Built from numbers only, so whatever the attrs hold cannot become markup; anything else draws nothing."""
    if not isinstance(points, list):
        return Markup("")
    rows: list[tuple[float, float | None]] = []
    for point in points[-MAX_SPARK_POINTS:]:
        if not (isinstance(point, (list, tuple)) and len(point) == 2 and isinstance(point[0], int)):
            continue
        value = point[1]
        number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        rows.append((float(point[0]), number if number is not None and math.isfinite(number) else None))
    finite = [v for _, v in rows if v is not None]
    if len(rows) < 2:
        return Markup("")
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    first, last = rows[0][0], rows[-1][0]

    def x(step: float) -> float:
        return SPARK_PAD + (step - first) / ((last - first) or 1) * (SPARK_W - 2 * SPARK_PAD)

    def y(value: float) -> float:
        return SPARK_H - SPARK_PAD - (value - lo) / ((hi - lo) or 1) * (SPARK_H - 2 * SPARK_PAD)

    line = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in rows if v is not None)
    marks = "".join(f'<circle cx="{x(s):.1f}" cy="{SPARK_PAD}" r="3" class="spark-bad"/>' for s, v in rows if v is None)
    name = escape(str(series)[:64])
    label = escape(f"{str(series)[:64]} over steps {first:.0f} to {last:.0f}")
    return Markup(
        f'<figure class="spark"><svg viewBox="0 0 {SPARK_W} {SPARK_H}" width="{SPARK_W}" height="{SPARK_H}" '
        f'role="img" aria-label="{label}"><polyline points="{line}" fill="none" stroke="currentColor" '
        f'stroke-width="1.5"/>{marks}</svg><figcaption class="muted small">{name}, steps {first:.0f}–{last:.0f}'
        f"{' (red: not a number)' if marks else ''}</figcaption></figure>")


def environment() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["when"] = when
    env.filters["short"] = short
    env.filters["markdown"] = markdown_html
    env.filters["plain"] = plain
    env.filters["sparkline"] = sparkline
    env.filters["label"] = label_of  # an incident as people name what it is about (core.names)
    env.filters["entrypoint"] = entrypoint_of
    return env
