"""Metrics read through Argus (the API's /v1/metrics, the MCP server's metric tools): a person or the ops agent
asks for a series around an incident without access to Prometheus itself.

The caller describes a query (a metric, exact label matchers, one range function, one aggregation) and Argus
writes the PromQL. Why not take PromQL: a query Argus writes is valid, names one metric (no `{__name__=~".+"}`
over the whole server), is read-only by construction, and costs at most MAX_SERIES series of MAX_POINTS points over
at most MAX_RANGE; a malformed request is a 422 naming the field, never Prometheus's parse error. The PromQL sent
is returned with the answer, so the caller can run it in Grafana. `around(incident)` gives the per-node summaries
the incident's report quotes (rca/metrics.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Literal

from core.errors import InputError, SourceUnavailable
from core.types import Incident, utcnow

if TYPE_CHECKING:
    from collectors.prometheus import PrometheusClient
    from rca.evidence import MetricSummary

MAX_RANGE = timedelta(hours=24)
MAX_POINTS = 1000  # per series: the step grows with the range (Prometheus itself refuses past 11,000)
MAX_SERIES = 50
MIN_STEP_S = 1.0
DEFAULT_SPAN = timedelta(minutes=15)

RangeFunction = Literal["none", "rate", "increase", "avg_over_time", "max_over_time", "min_over_time"]
Aggregation = Literal["none", "avg", "max", "min", "sum", "count"]
MatchOp = Literal["=", "!="]


@dataclass(frozen=True)
class Matcher:
    label: str
    op: MatchOp
    value: str

    def promql(self) -> str:
        # a PromQL string literal: backslash and double quote escaped (control characters never get this far)
        quoted = self.value.replace("\\", "\\\\").replace('"', '\\"')
        return f'{self.label}{self.op}"{quoted}"'


@dataclass(frozen=True)
class MetricQuery:
    """One series query, validated by the API's parameters (argus/api/metric_queries.py) before it is built."""

    metric: str
    matchers: tuple[Matcher, ...] = ()
    function: RangeFunction = "none"
    window_s: int = 300  # the range function's window
    aggregation: Aggregation = "none"
    by: tuple[str, ...] = ()

    def promql(self) -> str:
        selector = self.metric + ("{" + ",".join(m.promql() for m in self.matchers) + "}" if self.matchers else "")
        expr = selector if self.function == "none" else f"{self.function}({selector}[{self.window_s}s])"
        if self.aggregation == "none":
            return expr
        grouping = f" by ({','.join(self.by)})" if self.by else ""
        return f"{self.aggregation}{grouping} ({expr})"


def step_for(start: datetime, end: datetime, asked: float | None) -> float:
    """The step: what was asked, but never more than MAX_POINTS points a series, nor under MIN_STEP_S."""
    least = max(MIN_STEP_S, math.ceil((end - start).total_seconds() / (MAX_POINTS - 1)))
    return max(least, asked or 0.0)


class MetricQueries:
    """Range queries Argus builds, and the summaries around an incident, over one Prometheus."""

    def __init__(self, client: PrometheusClient, around: Callable[[Incident], list[MetricSummary]], *,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.client = client
        self._around = around
        self.clock = clock

    def range(self, query: MetricQuery, *, start: datetime | None = None, end: datetime | None = None,
              step_s: float | None = None) -> dict[str, Any]:
        end = _aware(end) if end is not None else self.clock()
        start = _aware(start) if start is not None else end - DEFAULT_SPAN
        if start >= end:
            raise InputError(f"start {start.isoformat()} is not before end {end.isoformat()}",
                             hint="give start before end, or neither (the last 15 minutes)")
        if end - start > MAX_RANGE:
            raise InputError(f"{end - start} is more than the {MAX_RANGE} one query may span",
                             hint="ask for a shorter range, or several")
        step = step_for(start, end, step_s)
        promql = query.promql()
        try:
            series = self.client.query_range(promql, start, end, step)
        except InputError as exc:  # Prometheus refused a query Argus wrote: its limits (a timeout), not the caller's
            raise SourceUnavailable("Prometheus", self.client.url, f"it refused {promql}: {exc.message[:300]}",
                                    hint="try a shorter range or a narrower query") from None
        return {
            "promql": promql, "start": start.isoformat(), "end": end.isoformat(), "step_s": step,
            "series_total": len(series), "truncated": len(series) > MAX_SERIES,
            "series": [{"metric": dict(s.get("metric") or {}), "values": _points(s.get("values") or ())}
                       for s in series[:MAX_SERIES]],
        }

    def around(self, incident: Incident) -> list[dict[str, Any]]:
        """GPU and node summaries of the incident's nodes from before it began to shortly after (what its report
        quotes), one per node and measure."""
        return [s.model_dump(mode="json") for s in self._around(incident)]


def _points(values: Sequence[Any]) -> list[list[float | None]]:
    out: list[list[float | None]] = []
    for ts, value in values:
        try:
            number: float | None = float(value)
        except (TypeError, ValueError):
            number = None
        out.append([float(ts), None if number is None or math.isnan(number) or math.isinf(number) else number])
    return out


def _aware(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=timezone.utc)
