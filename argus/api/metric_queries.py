"""Metrics through Argus: a series query Argus writes the PromQL for, and the summaries around an incident
(argus/metric_queries.py says why the caller describes the query instead of sending PromQL). Viewer role; every
bound is in the parameters' documented constraints, so a request the schema allows is answered."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request

from argus.api.auth import require
from argus.api.params import IncidentIdPath
from argus.metric_queries import Aggregation, Matcher, MetricQueries, MetricQuery, RangeFunction
from argus.store.tokens import Role
from core.errors import InputError, NotConfigured
from core.types import IsoDateTime

router = APIRouter(tags=["metrics"], dependencies=[Depends(require(Role.VIEWER))])

_LABEL = r"[a-zA-Z_][a-zA-Z0-9_]{0,99}"
_MATCHER = re.compile(rf"^({_LABEL})(!?=)([^\x00-\x1f\x7f]{{0,200}})$")

MetricName = Annotated[str, Query(pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]{0,199}$",
                                  description="the metric, e.g. DCGM_FI_DEV_GPU_UTIL or ray_node_mem_used")]
Matchers = Annotated[list[Annotated[str, Query(pattern=_MATCHER.pattern)]], Query(
    max_length=10, description='exact label matchers, each label=value or label!=value, e.g. Hostname=gpu-3')]
LabelNames = Annotated[list[Annotated[str, Query(pattern=f"^{_LABEL}$")]], Query(
    max_length=5, description="labels the aggregation keeps (with agg only)")]


def metric_queries_of(request: Request) -> MetricQueries:
    found: MetricQueries | None = request.app.state.metric_queries
    if found is None:
        raise NotConfigured("this Argus reads no Prometheus", hint="set prometheus_url and restart argus serve")
    return found


@router.get("/v1/metrics/query_range")
def query_range(
    request: Request,
    metric: MetricName,
    match: Matchers = [],  # noqa: B006 - FastAPI copies a parameter's default per request
    fn: Annotated[RangeFunction, Query(description="a range function over window_s, or none")] = "none",
    window_s: Annotated[int, Query(ge=10, le=3600, description="the range function's window")] = 300,
    agg: Annotated[Aggregation, Query(description="an aggregation over the series, or none")] = "none",
    by: LabelNames = [],  # noqa: B006
    end: Annotated[IsoDateTime | None, Query(description="the range's end (default: now)")] = None,
    minutes: Annotated[int, Query(ge=1, le=1440, description="the range's length, up to a day")] = 15,
    step_s: Annotated[float | None, Query(gt=0, le=86400, description="seconds between points; raised to keep "
                                                                      "at most 1000 points a series")] = None,
) -> dict[str, Any]:
    """One metric's series over a range, at most 50 series of 1000 points, with the PromQL Argus sent."""
    matchers = []
    for text in match:
        found = _MATCHER.match(text)
        if found is None:  # the parameter's pattern was checked: only a caller in Python gets here
            raise InputError(f"{text[:80]!r} is not label=value nor label!=value", hint="e.g. Hostname=gpu-3")
        label, op, value = found.groups()
        matchers.append(Matcher(label, "!=" if op == "!=" else "=", value))
    query = MetricQuery(metric=metric, matchers=tuple(matchers), function=fn, window_s=window_s, aggregation=agg,
                        by=tuple(by) if agg != "none" else ())
    queries = metric_queries_of(request)
    end_at = end if end is not None else queries.clock()
    return queries.range(query, start=end_at - timedelta(minutes=minutes), end=end_at, step_s=step_s)


@router.get("/v1/incidents/{incident_id:ident}/metrics")
def incident_metrics(request: Request, incident_id: IncidentIdPath) -> dict[str, Any]:
    """The GPU and host readings of the incident's nodes from 15 minutes before it to 2 minutes after (per node:
    utilisation, memory, temperature, power, last Xid, host memory), as its report quotes them."""
    incident = request.app.state.store.get_incident(incident_id)
    return {"incident": incident.id, "summaries": metric_queries_of(request).around(incident)}
