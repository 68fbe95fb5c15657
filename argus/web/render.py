"""Templates and Markdown for the web page: everything shown is escaped unless this module made it HTML.

Jinja2 autoescapes every value. The one HTML we make ourselves is a report's Markdown, rendered by
markdown-it-py with raw HTML off and images off, links only to http(s) pages (with rel=noopener), so a log
line quoted in a report can never become markup, script or a link to a `javascript:` URL.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markdown_it import MarkdownIt
from markupsafe import Markup

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


def environment() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["when"] = when
    env.filters["short"] = short
    env.filters["markdown"] = markdown_html
    env.filters["plain"] = plain
    env.filters["label"] = label_of  # an incident as people name what it is about (core.names)
    env.filters["entrypoint"] = entrypoint_of
    return env
