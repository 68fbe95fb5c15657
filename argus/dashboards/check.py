"""Checking every expression of the built dashboards: each must parse (promtool, one run for all of them)
and name only known metrics; every problem is collected, none stops the rest.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from argus.dashboards.build import Built, Problem, build_all
from argus.dashboards.known_metrics import KnownMetrics, known_metrics
from argus.dashboards.queries import Query, queries_of, substitute, variable_promql, variable_samples
from core.errors import ConfigError
from detectors.promql import metric_names, promtool_check_rules, rule_file_text

_PROMTOOL_TIMEOUT_S = 120.0
_MAX_EXPR_IN_MESSAGE = 240


@dataclass
class CheckReport:
    dashboards: list[str] = field(default_factory=list)
    queries: int = 0
    problems: list[Problem] = field(default_factory=list)
    uses: dict[str, set[str]] = field(default_factory=dict)  # metric name -> "dashboard: where" using it

    @property
    def ok(self) -> bool:
        return not self.problems


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_EXPR_IN_MESSAGE else text[: _MAX_EXPR_IN_MESSAGE - 1] + "…"


def check_built(built: Sequence[Built], known: KnownMetrics, *, promtool: str | None = None) -> CheckReport:
    """Check every query of the rendered dashboards; all problems are collected, none stops the rest."""
    report = CheckReport(dashboards=[b.name for b in built])
    to_parse: list[tuple[Query, str]] = []
    for b in built:
        data = b.data()
        queries, problems = queries_of(b.name, data)
        report.problems.extend(problems)
        report.queries += len(queries)
        samples = variable_samples(data)
        for query in queries:
            text, unknown = substitute(query.text, samples)
            for name in dict.fromkeys(unknown):
                report.problems.append(Problem(query.dashboard, query.where,
                                               f"uses ${name}, which is neither a variable of this dashboard nor "
                                               "a Grafana built-in"))
            promql: str | None = text
            if query.kind == "variable":
                promql, trouble = variable_promql(text)
                if trouble:
                    report.problems.append(Problem(query.dashboard, query.where, f"{trouble}: {_short(query.text)}"))
            if promql is None:
                continue
            names, notes = metric_names(promql)
            for note in notes:
                report.problems.append(Problem(query.dashboard, query.where, note))
            for name in sorted(names):
                report.uses.setdefault(name, set()).add(f"{query.dashboard}: {query.where}")
                if name not in known:
                    report.problems.append(Problem(
                        query.dashboard, query.where,
                        f"names unknown metric '{name}' (not Ray's, a dcgm-exporter default counter, Argus's "
                        f"own or Prometheus's up) in: {_short(query.text)}",
                    ))
            to_parse.append((query, promql))
    errors = promtool_errors([promql for _, promql in to_parse], promtool=promtool)
    for (query, _), error in zip(to_parse, errors, strict=True):
        if error is not None:
            report.problems.append(Problem(query.dashboard, query.where,
                                           f"Prometheus cannot parse it: {error}; expression: {_short(query.text)}"))
    return report


_QUERY_GROUP = re.compile(r"q(?P<index>\d+)")


def promtool_errors(exprs: Sequence[str], *, promtool: str | None = None) -> list[str | None]:
    """promtool's complaint about each expression (None: it parses), from one `promtool check rules` run."""
    if not exprs:
        return []
    unique = list(dict.fromkeys(exprs))
    # One group per expression: promtool names the group in its complaint, which maps it back.
    groups = {f"q{i}": [{"record": "argus_dashboard_query", "expr": e}] for i, e in enumerate(unique)}
    verdict = promtool_check_rules(rule_file_text(groups), promtool=promtool, lint=False,
                                   timeout_s=_PROMTOOL_TIMEOUT_S)
    by_expr: dict[str, str] = {}
    for complaint in verdict.complaints():
        if m := _QUERY_GROUP.fullmatch(complaint.group):
            by_expr[unique[int(m.group("index"))]] = complaint.error.removeprefix("could not parse expression: ")
    if not verdict.ok and not by_expr:
        raise ConfigError(f"promtool check rules failed: {verdict.output[-2000:]}",
                          hint="run promtool by hand on the dashboards' expressions to see why")
    return [by_expr.get(e) for e in exprs]


def check_dashboards(folder: Path, *, promtool: str | None = None, known: KnownMetrics | None = None
                     ) -> tuple[list[Built], CheckReport]:
    built, load_problems = build_all(folder)
    report = check_built(built, known or known_metrics(folder), promtool=promtool)
    report.problems[:0] = load_problems
    return built, report
