"""Grafana dashboards as code: building dashboards/*.dashboard.py to JSON and checking every expression.

The library behind `argus dashboards build [--check]` and `argus dashboards ray-metrics` (argus/cli_dashboards.py).

`build` imports every dashboards/*.dashboard.py (grafanalib's convention: the file defines `dashboard`),
writes <name>.json beside it (sorted keys, so a rebuild is byte-identical) and checks every PromQL
expression in it: panel queries, variable queries (label_values(...)) and annotations. Grafana variables
are replaced by sample values, each expression is parsed by `promtool check rules` (as a recording rule
in a temporary file), and every metric it names must be known: Ray's (dashboards/known_metrics/ray.txt,
from a real scrape), dcgm-exporter's default counters (the simulator's list), Argus's own (whatever
`ArgusMetrics().registry` exports) or Prometheus's `up`. `--check` writes nothing and also fails when a
committed JSON differs from a fresh build.

`ray-metrics` writes that Ray list from a real scrape: of a throwaway local cluster by default, or of the
targets named with --target.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from core.errors import ArgusError, ConfigError, SourceUnavailable

SUFFIX = ".dashboard.py"
DEFAULT_DIR = Path("dashboards")
RAY_METRICS_FILE = Path("known_metrics") / "ray.txt"  # inside the dashboards folder
PROMETHEUS_OWN = frozenset({"up"})
EXIT_FAILED = 2
_PROMTOOL_TIMEOUT_S = 120.0
_MAX_EXPR_IN_MESSAGE = 240

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
_METRIC_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*\Z")


class DashboardError(ConfigError):
    """A dashboard file cannot be loaded or rendered."""


# --- loading and rendering --------------------------------------------------------------------------


@dataclass(frozen=True)
class Built:
    """One dashboard file rendered to Grafana JSON."""

    source: Path
    json_path: Path
    text: str

    @property
    def name(self) -> str:
        return self.source.name

    def data(self) -> dict[str, Any]:
        return json.loads(self.text)

    def is_fresh(self) -> bool:
        return self.json_path.is_file() and self.json_path.read_text(encoding="utf-8") == self.text


def dashboard_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise DashboardError(f"dashboards folder {folder} does not exist",
                             hint="run from the repository root or pass --dir")
    files = sorted(folder.glob("*" + SUFFIX))
    if not files:
        raise DashboardError(f"no *{SUFFIX} files in {folder}",
                             hint="add one that defines `dashboard = Dashboard(...)`")
    return files


def json_path_for(source: Path) -> Path:
    return source.with_name(source.name[: -len(SUFFIX)] + ".json")


def load_dashboard(source: Path) -> Any:
    """Run a *.dashboard.py file and return its `dashboard`; its folder is importable while it runs."""
    from grafanalib.core import Dashboard

    folder = source.parent.resolve()
    before = set(sys.modules)
    sys.path.insert(0, str(folder))
    try:
        spec = importlib.util.spec_from_file_location(f"_argus_dashboard_{source.name[: -len(SUFFIX)]}", source)
        if spec is None or spec.loader is None:
            raise DashboardError(f"dashboard {source} cannot be imported", hint=f"name it <name>{SUFFIX}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses and pickling look a class's module up here
        try:
            spec.loader.exec_module(module)
        except Exception as exc:  # the file is code: whatever it raises is the file's fault
            raise DashboardError(
                f"dashboard {source} failed to load: {type(exc).__name__}: {exc}",
                hint=f"run `python {source}` from its folder to see the traceback",
            ) from exc
    finally:
        if str(folder) in sys.path:
            sys.path.remove(str(folder))
        # Helpers imported from the folder (argus_panels) are forgotten, so another folder gets its own.
        for name in set(sys.modules) - before:
            origin = getattr(sys.modules[name], "__file__", None)
            if origin and Path(origin).resolve().parent == folder:
                del sys.modules[name]
    dashboard = getattr(module, "dashboard", None)
    if dashboard is None:
        raise DashboardError(f"dashboard {source} defines no `dashboard`",
                             hint="end the file with `dashboard = Dashboard(...)`")
    if not isinstance(dashboard, Dashboard):
        raise DashboardError(f"`dashboard` in {source} is a {type(dashboard).__name__}, not a grafanalib Dashboard",
                             hint="assign a grafanalib.core.Dashboard to `dashboard`")
    return dashboard


def render(dashboard: Any, source: Path) -> str:
    """Grafana JSON as grafanalib's generate-dashboard writes it (sorted keys, indent 2), panel ids filled in."""
    from grafanalib._gen import DashboardEncoder

    try:
        data = dashboard.auto_panel_ids().to_json_data()
        return json.dumps(data, sort_keys=True, indent=2, cls=DashboardEncoder) + "\n"
    except (TypeError, ValueError) as exc:
        raise DashboardError(f"dashboard {source} cannot be written as JSON: {exc}",
                             hint="use grafanalib objects, dicts, lists, strings and numbers only") from exc


def build_one(source: Path) -> Built:
    return Built(source, json_path_for(source), render(load_dashboard(source), source))


# --- queries inside a dashboard ---------------------------------------------------------------------


@dataclass(frozen=True)
class Query:
    """One expression as written in a dashboard, and where: a panel's target, a variable, an annotation."""

    dashboard: str
    where: str
    text: str
    kind: str = "promql"  # or "variable": a Grafana variable query such as label_values(...)


@dataclass(frozen=True)
class Problem:
    dashboard: str
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.dashboard}: {self.where}: {self.message}"


def _panels(items: Any) -> Iterable[dict[str, Any]]:
    for panel in items if isinstance(items, list) else []:
        if isinstance(panel, dict):
            yield panel
            yield from _panels(panel.get("panels"))  # a collapsed row holds its panels


def queries_of(name: str, data: Mapping[str, Any]) -> tuple[list[Query], list[Problem]]:
    """Every PromQL expression in a dashboard's JSON, plus problems such as a target without one."""
    queries: list[Query] = []
    problems: list[Problem] = []
    rows = data.get("rows") if isinstance(data.get("rows"), list) else []
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
    templating = data.get("templating") if isinstance(data.get("templating"), dict) else {}
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
    annotations = data.get("annotations") if isinstance(data.get("annotations"), dict) else {}
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
    templating = data.get("templating") if isinstance(data.get("templating"), dict) else {}
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


# --- a small PromQL tokenizer: which metric names does an expression read? ----------------------------

AGGREGATIONS = frozenset({
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
    "quantile", "limitk", "limit_ratio",
})
_LABEL_LIST_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_KEYWORDS = _LABEL_LIST_KEYWORDS | {"and", "or", "unless", "bool", "offset", "atan2"}
_NUMBER_WORDS = frozenset({"inf", "nan"})
_DURATION = re.compile(r"(?:\d+(?:ms|[smhdwy]))+")
_NUMBER = re.compile(r"0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_NAME_MATCHER = re.compile(r"""(?:^|,)\s*__name__\s*(?P<op>=~|!=|!~|=)\s*(?P<q>["'`])(?P<value>.*?)(?P=q)""", re.S)


def _end_of_string(text: str, start: int) -> int:
    """Index after the string literal opening at `start` (or len(text) when it never closes)."""
    quote = text[start]
    i = start + 1
    while i < len(text):
        if text[i] == "\\" and quote != "`":
            i += 2
            continue
        if text[i] == quote:
            return i + 1
        i += 1
    return len(text)


def _end_of_group(text: str, start: int, open_char: str, close_char: str) -> int:
    """Index after the bracket closing the one at `start`, skipping strings (len(text) when unclosed)."""
    depth = 0
    i = start
    while i < len(text):
        c = text[i]
        if c in "\"'`":
            i = _end_of_string(text, i)
            continue
        if c == open_char:
            depth += 1
        elif c == close_char:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return len(text)


def _next_significant(text: str, i: int) -> tuple[str, int]:
    """The next character that is not space or inside a comment, and its index."""
    while i < len(text):
        if text[i].isspace():
            i += 1
        elif text[i] == "#":
            newline = text.find("\n", i)
            i = len(text) if newline < 0 else newline + 1
        else:
            return text[i], i
    return "", i


def _word_at(text: str, i: int) -> str:
    m = _IDENT.match(text, i)
    return m.group() if m else ""


def metric_names(expr: str) -> tuple[set[str], list[str]]:
    """The metric names `expr` selects, and notes on selections that cannot be checked.

    Function and aggregation names, keywords, the label lists of by/without/on/ignoring/group_*, label
    matchers, strings, durations and numbers are skipped. Only PromQL that promtool accepts matters:
    on broken input this never fails, it just finds what it can.
    """
    names: set[str] = set()
    notes: list[str] = []
    i = 0
    while i < len(expr):
        c = expr[i]
        if c.isspace():
            i += 1
        elif c == "#":
            newline = expr.find("\n", i)
            i = len(expr) if newline < 0 else newline + 1
        elif c in "\"'`":
            i = _end_of_string(expr, i)
        elif c == "{":
            end = _end_of_group(expr, i, "{", "}")
            for m in _NAME_MATCHER.finditer(expr[i + 1 : end - 1]):
                if m.group("op") == "=":
                    names.add(m.group("value"))
                elif m.group("op") == "=~":
                    notes.append(f"selects metric names by regex (__name__=~{m.group('value')!r}); "
                                 "name each metric so it can be checked")
            i = end
        elif c == "[":
            i = _end_of_group(expr, i, "[", "]")
        elif c.isdigit() or (c == "." and expr[i + 1 : i + 2].isdigit()):
            m = _DURATION.match(expr, i) or _NUMBER.match(expr, i)
            i = m.end() if m else i + 1
        elif m := _IDENT.match(expr, i):
            word = m.group()
            i = m.end()
            following, at = _next_significant(expr, i)
            lower = word.lower()
            if lower in _KEYWORDS:
                if lower in _LABEL_LIST_KEYWORDS and following == "(":
                    i = _end_of_group(expr, at, "(", ")")
            elif lower in _NUMBER_WORDS:
                pass
            elif following == "(":
                pass  # a function call or an aggregation: its arguments are read next
            elif word in AGGREGATIONS and _word_at(expr, at) in ("by", "without"):
                pass  # sum by (x) (...)
            else:
                names.add(word)
        else:
            i += 1
    return names, notes


# --- what metrics exist ------------------------------------------------------------------------------


@dataclass(frozen=True)
class KnownMetrics:
    """Metric names by where they come from (Ray, dcgm-exporter, Argus, Prometheus)."""

    sources: Mapping[str, frozenset[str]]

    def source_of(self, name: str) -> str | None:
        return next((source for source, names in self.sources.items() if name in names), None)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.source_of(name) is not None


def dcgm_metric_names() -> frozenset[str]:
    from argus.sim.dcgm_exporter import DEFAULT_COUNTERS

    return frozenset(counter.name for counter in DEFAULT_COUNTERS)


def read_metric_list(path: Path) -> frozenset[str]:
    """Names from a known-metrics file: one a line, '#' starts a comment line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ConfigError(f"known-metrics file {path} does not exist",
                          hint="write it with `argus dashboards ray-metrics`") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"known-metrics file {path} cannot be read: {exc}",
                          hint="write it again with `argus dashboards ray-metrics`") from None
    names = set()
    for number, line in enumerate(lines, start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not _METRIC_NAME.match(line):
            raise ConfigError(f"{path}:{number}: {line[:80]!r} is not a metric name",
                              hint="one name a line; regenerate it with `argus dashboards ray-metrics`")
        names.add(line)
    if not names:
        raise ConfigError(f"known-metrics file {path} lists no metric",
                          hint="regenerate it with `argus dashboards ray-metrics`")
    return frozenset(names)


def recorded_ray_version(path: Path) -> str | None:
    """The Ray version a known-metrics file says it was scraped from (its '# Ray version: x' line)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if m := re.match(r"#\s*Ray version:\s*(\S+)", line):
            return m.group(1)
    return None


def known_metrics(folder: Path, *, argus_registry: Any = None) -> KnownMetrics:
    """Ray's from the folder's known_metrics/ray.txt, dcgm-exporter's, Argus's (`argus_registry`, by default
    a fresh ArgusMetrics's: whatever Argus exports now) and Prometheus's."""
    from argus.exporter import ArgusMetrics, exported_series_names

    registry = argus_registry if argus_registry is not None else ArgusMetrics().registry
    return KnownMetrics({
        "Ray": read_metric_list(folder / RAY_METRICS_FILE),
        "dcgm-exporter": dcgm_metric_names(),
        "Argus": frozenset(exported_series_names(registry)),
        "Prometheus": PROMETHEUS_OWN,
    })


# --- checking ----------------------------------------------------------------------------------------


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


_PROMTOOL_LINE = re.compile(r'group "q(?P<index>\d+)", rule \d+, "[^"]*": (?P<error>.*)')


def promtool_errors(exprs: Sequence[str], *, promtool: str | None = None) -> list[str | None]:
    """promtool's complaint about each expression (None: it parses), from one `promtool check rules` run."""
    from detectors.metric_rules import find_promtool

    if not exprs:
        return []
    binary = find_promtool(promtool)
    unique = list(dict.fromkeys(exprs))
    # One group per expression: promtool names the group in its complaint, which maps it back.
    groups = [{"name": f"q{i}", "rules": [{"record": "argus_dashboard_query", "expr": e}]}
              for i, e in enumerate(unique)]
    with tempfile.TemporaryDirectory(prefix="argus-dashboards-") as tmp:
        path = Path(tmp) / "queries.rules.yml"
        path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False, allow_unicode=True), encoding="utf-8")
        try:
            proc = subprocess.run([binary, "check", "rules", "--lint=none", str(path)],
                                  capture_output=True, text=True, timeout=_PROMTOOL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise ConfigError(f"promtool check rules did not finish within {_PROMTOOL_TIMEOUT_S:g} s",
                              hint="check that promtool runs: `promtool --version`") from None
    by_expr: dict[str, str] = {}
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr).strip()
        for line in output.splitlines():
            if m := _PROMTOOL_LINE.search(line):
                error = m.group("error").strip().removeprefix("could not parse expression: ")
                by_expr[unique[int(m.group("index"))]] = error
        if not by_expr:
            raise ConfigError(f"promtool check rules failed: {output[-2000:]}",
                              hint="run promtool by hand on the dashboards' expressions to see why")
    return [by_expr.get(e) for e in exprs]


def build_all(folder: Path) -> tuple[list[Built], list[Problem]]:
    """Render every dashboard in `folder`; one that fails to load is a problem, the others still build."""
    built: list[Built] = []
    problems: list[Problem] = []
    for source in dashboard_files(folder):
        try:
            built.append(build_one(source))
        except DashboardError as exc:
            problems.append(Problem(source.name, "file", f"{exc.message} ({exc.hint})" if exc.hint else exc.message))
    return built, problems


def check_dashboards(folder: Path, *, promtool: str | None = None, known: KnownMetrics | None = None
                     ) -> tuple[list[Built], CheckReport]:
    built, load_problems = build_all(folder)
    report = check_built(built, known or known_metrics(folder), promtool=promtool)
    report.problems[:0] = load_problems
    return built, report


# --- Ray's metric names from a real scrape ------------------------------------------------------------

_SAMPLE_NAME = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)")
_RAY_VERSION_LABEL = re.compile(r'[{,]Version="([^"]+)"')


def parse_exposition(text: str) -> tuple[set[str], set[str]]:
    """Sample names in a Prometheus text exposition, and the Ray versions its `Version` labels name."""
    names: set[str] = set()
    versions: set[str] = set()
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if m := _SAMPLE_NAME.match(line):
            names.add(m.group(1))
        versions.update(_RAY_VERSION_LABEL.findall(line))
    return names, versions


def scrape(target: str, *, timeout: float = 10.0) -> str:
    """GET http://<target>/metrics (target: host:port, or a full URL)."""
    import httpx

    url = target if "://" in target else f"http://{target}/metrics"
    try:
        resp = httpx.get(url, timeout=timeout)
    except httpx.HTTPError as exc:
        raise SourceUnavailable("metrics endpoint", url, str(exc) or type(exc).__name__,
                                hint="is the Ray node up, and is this its metrics export port?") from None
    if resp.status_code != 200:
        raise SourceUnavailable("metrics endpoint", url, f"HTTP {resp.status_code}", hint="check the address")
    return resp.text


def sd_targets(sd_file: Path) -> list[str]:
    """The targets of a Prometheus file_sd file (Ray's prom_metrics_service_discovery.json)."""
    try:
        groups = json.loads(sd_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"service-discovery file {sd_file} cannot be read: {exc}",
                          hint="point --sd-file at Ray's <temp dir>/prom_metrics_service_discovery.json") from None
    if not isinstance(groups, list):
        raise ConfigError(f"service-discovery file {sd_file} is not a list of target groups",
                          hint="point --sd-file at Ray's prom_metrics_service_discovery.json")
    targets = [t for g in groups if isinstance(g, dict) and isinstance(g.get("targets"), list)
               for t in g["targets"] if isinstance(t, str)]
    return list(dict.fromkeys(targets))


def scrape_ray_names(targets: Sequence[str]) -> tuple[set[str], set[str]]:
    names: set[str] = set()
    versions: set[str] = set()
    for target in targets:
        found, seen_versions = parse_exposition(scrape(target))
        names |= found
        versions |= seen_versions
    return names, versions


def wait_for_ray_names(sd_file: Path, nodes: int, *, timeout: float = 180.0, settle_rounds: int = 3,
                       pause_s: float = 2.0) -> tuple[set[str], set[str]]:
    """Scrape every target Ray lists until all `nodes` node agents report node metrics, then a few rounds
    more (some metrics appear only after the first reports); return the union of names and versions."""
    deadline = time.monotonic() + timeout
    last_error = "no scrape yet"
    names: set[str] = set()
    versions: set[str] = set()
    settled = 0
    while True:
        try:
            targets = sd_targets(sd_file) if sd_file.exists() else []
            reporting = 0
            for target in targets:
                found, seen = parse_exposition(scrape(target))
                names |= found
                versions |= seen
                reporting += "ray_node_cpu_utilization" in found
            if reporting >= nodes:
                settled += 1
                if settled > settle_rounds:
                    return names, versions
            last_error = f"{reporting} of {nodes} node agents report node metrics"
        except ArgusError as exc:
            last_error = exc.message
        if time.monotonic() >= deadline:
            raise SourceUnavailable("Ray's metrics", str(sd_file), f"not ready within {timeout:.0f} s: {last_error}",
                                    hint="see the Ray logs; a busy machine may need a longer --timeout")
        time.sleep(pause_s)


def ray_metrics_text(names: Iterable[str], versions: Iterable[str], origin: str) -> str:
    version = ", ".join(sorted(versions)) or "unknown"
    header = [
        "# Metric names Ray serves to Prometheus, one a line: every node's metrics agent, the dashboard and the",
        "# autoscaler. Metrics Ray creates only once there is work (tasks, actors, jobs) may be missing.",
        f"# Scraped from {origin} by `argus dashboards ray-metrics`; regenerate after upgrading Ray.",
        f"# Ray version: {version}",
    ]
    return "\n".join(header + sorted(names)) + "\n"


def scrape_local_ray(*, timeout: float = 180.0) -> tuple[set[str], set[str]]:
    """Start a throwaway local cluster (head + one worker advertising GPUs), scrape it, stop it."""
    from argus.localstack.ray_cluster import RayCluster

    with tempfile.TemporaryDirectory(prefix="argus-ray-metrics-") as tmp:
        cluster = RayCluster(Path(tmp), worker_ips=("127.0.0.3",), worker_gpus=4)
        with cluster:
            return wait_for_ray_names(cluster.sd_file, nodes=len(cluster.nodes), timeout=timeout)


# --- the commands ------------------------------------------------------------------------------------
