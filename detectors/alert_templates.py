"""Prometheus alert templates, the part Argus renders itself: `{{ $labels.<name> }}`, `{{ $value }}` and
`{{ $value | humanizePercentage }}`, filled in exactly as Prometheus fills them, so the summary Argus writes
and the one Alertmanager sends are the same text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

_TEMPLATE_RE = re.compile(r"\{\{(.*?)\}\}", re.S)
_PLACEHOLDER_RE = re.compile(
    r"\s*(?:\$labels\.(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)|\$value(?P<pct>\s*\|\s*humanizePercentage)?)\s*"
)


def template_problem(template: str) -> str | None:
    """Why a summary template cannot be rendered the same by Argus and Prometheus, or None if it can."""
    for m in _TEMPLATE_RE.finditer(template):
        if _PLACEHOLDER_RE.fullmatch(m.group(1)) is None:
            return f"unsupported placeholder {m.group(0)!r}"
    rest = _TEMPLATE_RE.sub("", template)
    if "{{" in rest or "}}" in rest:
        return "unbalanced {{ or }}"
    return None


def render_template(template: str, labels: Mapping[str, str], value: float) -> str:
    """The template with its placeholders filled the way Prometheus's alert templates fill them."""

    def fill(m: re.Match[str]) -> str:
        p = _PLACEHOLDER_RE.fullmatch(m.group(1))
        if p is None:  # refused at load; kept literal for rules built in code
            return m.group(0)
        if p.group("label"):
            return str(labels.get(p.group("label"), ""))
        return _go_percent(value) if p.group("pct") else go_float(value)

    return _TEMPLATE_RE.sub(fill, template)


def go_float(value: float) -> str:
    """A float as Go's fmt %v prints it: shortest digits, exponent form below 1e-4 and from 1e6 up."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "0"
    exp = math.floor(math.log10(abs(value)))
    if -4 <= exp < 6:  # repr is also positional here, with the same shortest digits
        text = repr(value)
        return text[:-2] if text.endswith(".0") else text
    for digits in range(17):
        text = f"{value:.{digits}e}"
        if float(text) == value:
            break
    mantissa, _, exponent = text.partition("e")
    sign, num = exponent[0], exponent[1:].lstrip("0")
    return f"{mantissa}e{sign}{num.rjust(2, '0')}"


def _go_percent(value: float) -> str:
    # Prometheus: fmt.Sprintf("%.4g%%", v*100); Python's %g agrees for finite values.
    if math.isnan(value) or math.isinf(value):
        return go_float(value * 100) + "%"
    return f"{value * 100:.4g}%"
