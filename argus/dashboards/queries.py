"""The PromQL inside a dashboard's JSON: panel queries, variable queries (label_values(...)) and annotations,
and the Grafana variables in them replaced by sample values so that promtool can parse them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from argus.dashboards.build import Problem

# Sample values for Grafana's built-in variables: anything Prometheus accepts in their usual places.
GRAFANA_BUILTINS: Mapping[str, str] = {
    "__interval": "1m",
    "__interval_ms": "60000",
    "__rate_interval": "4m",
    "__rate_interval_ms": "240000",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
    "__from": "1700000000000",
    "__to": "1700003600000",
    "__dashboard": "dashboard",
    "__org": "1",
    "__user": "user",
}
QUERY_VARIABLE_SAMPLE = "sample"  # what a query variable's value stands in as: fits matchers and regexes

# $name, ${name}, ${name:format}, [[name]], [[name:format]]; "$1" (label_replace) is not a variable.
_VARIABLE = re.compile(
    r"\$\{(?P<braced>[A-Za-z_]\w*)(?:[:.][^}]*)?\}|\[\[(?P<bracketed>[A-Za-z_]\w*)(?::[^\]]*)?\]\]"
    r"|\$(?P<plain>[A-Za-z_]\w*)"
)


@dataclass(frozen=True)
class Query:
    """One expression as written in a dashboard, and where: a panel's target, a variable, an annotation."""

    dashboard: str
    where: str
    text: str
    kind: str = "promql"  # or "variable": a Grafana variable query such as label_values(...)


def _list_at(data: Mapping[str, Any], key: str) -> list[Any]:
    """data[key] when it is a list, else empty (hand-edited JSON may hold anything there)."""
    value = data.get(key)
    return value if isinstance(value, list) else []


def _dict_at(data: Mapping[str, Any], key: str) -> dict[str, Any]:
    """data[key] when it is an object, else empty."""
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def _panels(items: Any) -> Iterable[dict[str, Any]]:
    for panel in items if isinstance(items, list) else []:
        if isinstance(panel, dict):
            yield panel
            yield from _panels(panel.get("panels"))  # a collapsed row holds its panels


def queries_of(name: str, data: Mapping[str, Any]) -> tuple[list[Query], list[Problem]]:
    """Every PromQL expression in a dashboard's JSON, plus problems such as a target without one."""
    queries: list[Query] = []
    problems: list[Problem] = []
    rows = _list_at(data, "rows")
    all_panels = list(_panels(data.get("panels")))
    all_panels += [p for r in rows if isinstance(r, dict) for p in _panels(r.get("panels"))]
    for panel in all_panels:
        title = panel.get("title") or f"id {panel.get('id')}"
        for target in panel.get("targets") or []:
            if not isinstance(target, dict):
                continue
            where = f"panel '{title}', query {target.get('refId') or '?'}"
            expr = target.get("expr")
            if not isinstance(expr, str) or not expr.strip():
                problems.append(Problem(name, where, "has no PromQL expression"))
                continue
            queries.append(Query(name, where, expr))
    templating = _dict_at(data, "templating")
    for variable in templating.get("list") or []:
        if not isinstance(variable, dict) or variable.get("type") != "query":
            continue
        where = f"variable ${variable.get('name')}"
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if not isinstance(query, str) or not query.strip():
            problems.append(Problem(name, where, "has no query"))
            continue
        queries.append(Query(name, where, query, kind="variable"))
    annotations = _dict_at(data, "annotations")
    for annotation in annotations.get("list") or []:
        if not isinstance(annotation, dict):
            continue
        expr = annotation.get("expr")
        if expr is None and isinstance(annotation.get("target"), dict):
            expr = annotation["target"].get("expr")
        if expr is None:
            continue  # Grafana's built-in annotations and non-Prometheus ones carry no PromQL
        where = f"annotation '{annotation.get('name')}'"
        if not isinstance(expr, str) or not expr.strip():
            problems.append(Problem(name, where, "has no PromQL expression"))
            continue
        queries.append(Query(name, where, expr))
    return queries, problems


def variable_samples(data: Mapping[str, Any]) -> dict[str, str]:
    """A value for each of the dashboard's variables to stand in when an expression is checked."""
    samples = dict(GRAFANA_BUILTINS)
    templating = _dict_at(data, "templating")
    for variable in templating.get("list") or []:
        if not isinstance(variable, dict) or not isinstance(variable.get("name"), str):
            continue
        kind, query = variable.get("type"), variable.get("query")
        if kind in ("custom", "interval") and isinstance(query, str) and query.strip():
            samples[variable["name"]] = query.split(",")[0].strip()
        elif kind in ("constant", "textbox") and isinstance(query, str):
            samples[variable["name"]] = query
        elif kind == "datasource":
            samples[variable["name"]] = "prometheus"
        else:
            samples[variable["name"]] = QUERY_VARIABLE_SAMPLE
    return samples


def substitute(text: str, samples: Mapping[str, str]) -> tuple[str, list[str]]:
    """`text` with Grafana variables replaced by samples, and the names of variables that have none."""
    unknown: list[str] = []

    def replace(match: re.Match[str]) -> str:
        name = match.group("braced") or match.group("bracketed") or match.group("plain")
        if name in samples:
            return samples[name]
        unknown.append(name)
        return QUERY_VARIABLE_SAMPLE

    return _VARIABLE.sub(replace, text), unknown


_LABEL_VALUES = re.compile(r"\s*label_values\s*\((?P<args>.*)\)\s*\Z", re.S)
_SELECTOR_AND_LABEL = re.compile(r"(?P<selector>.*),\s*(?P<label>[A-Za-z_][A-Za-z0-9_]*)\s*\Z", re.S)
_SERIES_SELECTOR = re.compile(r"\s*(?:[A-Za-z_:][A-Za-z0-9_:]*\s*(?:\{.*\})?|\{.*\})\s*\Z", re.S)
_QUERY_RESULT = re.compile(r"\s*query_result\s*\((?P<expr>.*)\)\s*\Z", re.S)
_NOTHING_TO_CHECK = re.compile(r"\s*(?:label_names|metrics)\s*\(.*\)\s*\Z", re.S)


def variable_promql(query: str) -> tuple[str | None, str | None]:
    """The PromQL inside a Grafana variable query, or None; and a problem with the query, or None."""
    if m := _LABEL_VALUES.match(query):
        args = m.group("args").strip()
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", args):
            return None, None  # label_values(label): every series, nothing to check
        sm = _SELECTOR_AND_LABEL.match(args)
        if sm is None:
            return None, "label_values(...) wants (series selector, label name)"
        selector = sm.group("selector")
        if not _SERIES_SELECTOR.match(selector):
            return None, ("label_values(...) takes a series selector such as metric{label=\"x\"}, "
                          f"not {selector.strip()!r}")
        return selector.strip(), None
    if m := _QUERY_RESULT.match(query):
        return m.group("expr").strip(), None
    if _NOTHING_TO_CHECK.match(query):
        return None, None
    return None, "is not a Grafana Prometheus variable query: use label_values, label_names, metrics or query_result"
