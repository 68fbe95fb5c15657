"""What the Argus dashboards share: the datasource variable, panel shapes, the grid layout, PromQL joins.

Imported by the `*.dashboard.py` files beside it (`argus dashboards build` puts this folder on the import
path while it loads them). Every panel, query, variable and annotation reads the datasource chosen in the
`datasource` variable, so the JSON imports into any Grafana without editing datasource names or uids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grafanalib.core import (
    Annotations,
    Dashboard,
    DashboardLink,
    GridPos,
    RowPanel,
    Stat,
    Table,
    Target,
    Template,
    Templating,
    Time,
    TimeSeries,
)

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH = 24  # Grafana's grid is 24 columns wide
ARGUS_TAG = "argus"

# dcgm-exporter is scraped at <node IP>:9400 and its series carry that address as `instance`; Argus's
# argus_job_gpus names the node as `node_ip`. Deriving node_ip in the query, rather than by relabelling
# at scrape time, lets these dashboards work on a Prometheus nobody has reconfigured.
_NODE_IP_FROM_INSTANCE = '"node_ip", "$1", "instance", "([^:]+):.*"'


def node_ip(expr: str) -> str:
    """`expr` with a `node_ip` label taken from the host part of `instance` (host:port)."""
    return f"label_replace({expr}, {_NODE_IP_FROM_INSTANCE})"


def on_node(node_var: str = "node") -> str:
    """A label matcher for series scraped from the node whose IP is in the variable `node_var`."""
    # `.` in the IP matches itself among others; the ":" keeps 10.0.0.1 from matching 10.0.0.10.
    return f'instance=~"${node_var}:.*"'


def datasource_variable() -> Template:
    return Template(
        name="datasource",
        label="Prometheus",
        query="prometheus",
        type="datasource",
        default="Prometheus",
    )


def query_variable(name: str, label: str, query: str, *, include_all: bool = False) -> Template:
    """A variable whose values Grafana lists with `query` (label_values(...)), refreshed with the time range."""
    return Template(
        name=name,
        label=label,
        query=query,
        dataSource=DATASOURCE,
        type="query",
        refresh=2,  # on time range change: jobs and nodes come and go
        includeAll=include_all,
        sort=1,
    )


def custom_variable(name: str, label: str, values: Sequence[str]) -> Template:
    """A fixed list of choices; the first is the default."""
    return Template(name=name, label=label, query=",".join(values), type="custom", default=values[0])


def target(expr: str, legend: str = "", ref: str = "A", *, instant: bool = False, table: bool = False,
           interval: str = "") -> Target:
    return Target(
        expr=expr,
        legendFormat=legend,
        refId=ref,
        datasource=DATASOURCE,
        instant=instant,
        format="table" if table else "time_series",
        interval=interval,
        intervalFactor=1,
    )


def targets(*queries: tuple[str, str]) -> list[Target]:
    """(expr, legend) pairs as targets A, B, C, ..."""
    return [target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(queries)]


def timeseries(title: str, queries: list[Target], *, unit: str = "", description: str = "",
               width: int = 12, height: int = 8, bars: bool = False, stacked: bool = False,
               max_value: int | None = None, legend_table: bool = False) -> TimeSeries:
    panel = TimeSeries(
        title=title,
        description=description or None,
        dataSource=DATASOURCE,
        targets=queries,
        unit=unit,
        drawStyle="bars" if bars else "line",
        fillOpacity=80 if bars else 10,
        stacking={"mode": "normal", "group": "A"} if stacked else {},
        valueMin=0,
        valueMax=max_value,
        legendDisplayMode="table" if legend_table else "list",
        legendPlacement="right" if legend_table else "bottom",
        legendCalcs=["lastNotNull", "max"] if legend_table else [],
        tooltipMode="multi",
        tooltipSort="desc",
        gridPos=GridPos(h=height, w=width, x=0, y=0),
    )
    return panel


def stat(title: str, queries: list[Target], *, unit: str = "none", description: str = "", width: int = 6,
         height: int = 4, no_value: str = "0") -> Stat:
    return Stat(
        title=title,
        description=description or None,
        dataSource=DATASOURCE,
        targets=queries,
        format=unit,
        reduceCalc="lastNotNull",
        graphMode="none",
        noValue=no_value,
        gridPos=GridPos(h=height, w=width, x=0, y=0),
    )


def table(title: str, queries: list[Target], *, description: str = "", width: int = 12, height: int = 8,
          rename: dict[str, str] | None = None, unit: str = "", sort_by: str | None = None,
          link_columns: dict[str, str] | None = None, hide: tuple[str, ...] = ()) -> Table:
    """Instant queries in table format, merged into one table (one row per shared label set).

    `rename` maps Grafana's column names ("Value #A", a label name) to headers; the Time column is hidden, and the
    columns in `hide`. `link_columns`: column (as renamed) -> link title: the cell's own text is the link's URL.
    """
    transformations: list[dict[str, Any]] = [{"id": "merge", "options": {}}]
    transformations.append({
        "id": "organize",
        "options": {"excludeByName": {"Time": True, **{h: True for h in hide}}, "indexByName": {},
                    "renameByName": rename or {}},
    })
    panel = Table(
        title=title,
        description=description or None,
        dataSource=DATASOURCE,
        targets=queries,
        transformations=transformations,
        unit=unit,
        filterable=True,
        gridPos=GridPos(h=height, w=width, x=0, y=0),
    )
    extra: dict[str, Any] = {}
    if sort_by:
        extra["options"] = {"sortBy": [{"displayName": sort_by, "desc": True}]}
    if link_columns:
        extra["fieldConfig"] = {"defaults": {}, "overrides": [
            {"matcher": {"id": "byName", "options": column},
             "properties": [{"id": "links",
                             "value": [{"title": title, "url": "${__value.text}", "targetBlank": True}]}]}
            for column, title in link_columns.items()]}
    if extra:
        panel.extraJson = extra
    return panel


def row(title: str) -> RowPanel:
    return RowPanel(title=title, gridPos=GridPos(h=1, w=GRID_WIDTH, x=0, y=0))


def layout(panels: list[Any]) -> list[Any]:
    """Place panels left to right in the order given, wrapping at 24 columns; a row starts a new line.

    Each panel arrives with its width and height in gridPos; x and y are filled in here, so the files
    list panels in reading order and never compute coordinates.
    """
    x = y = line_height = 0
    placed = []
    for panel in panels:
        pos = panel.gridPos
        if isinstance(panel, RowPanel) or x + pos.w > GRID_WIDTH:
            y += line_height
            x = line_height = 0
        panel.gridPos = GridPos(h=pos.h, w=pos.w, x=x, y=y)
        placed.append(panel)
        if isinstance(panel, RowPanel):
            y += pos.h
            continue
        x += pos.w
        line_height = max(line_height, pos.h)
    return placed


def incident_annotation(matchers: str = "", *, enabled: bool = True) -> dict[str, Any]:
    """Argus incidents as annotations at the time each was opened.

    argus_incident_opened_timestamp_seconds holds the opening time as its value; Grafana's "series value
    as timestamp" wants milliseconds, hence the * 1000. Argus exports the series while the incident is open
    or mitigating, so an incident shows when the time range covers part of that span (Prometheus keeps it).
    """
    selector = f"argus_incident_opened_timestamp_seconds{{{matchers}}}" if matchers else (
        "argus_incident_opened_timestamp_seconds")
    return {
        "datasource": DATASOURCE,
        "enable": enabled,
        "expr": f"{selector} * 1000",
        "hide": False,
        "iconColor": "red",
        "name": "Incidents",
        "step": "60s",
        "tagKeys": "category,node",
        "textFormat": "incident {{incident_id}} ({{category}}) job {{submission_id}} node {{node}}",
        "titleFormat": "{{category}}",
        "useValueForTime": True,
    }


def annotations(*items: dict[str, Any]) -> Annotations:
    return Annotations(list=list(items))


def dashboard_links() -> list[DashboardLink]:
    """A menu of the other Argus dashboards, carrying the time range along."""
    return [DashboardLink(title="Argus dashboards", tags=[ARGUS_TAG], asDropdown=True, keepTime=True)]


def argus_dashboard(title: str, uid: str, description: str, panels: list[Any], *, variables: Sequence[Template] = (),
                    incidents: dict[str, Any], time_from: str = "now-24h", refresh: str = "1m") -> Dashboard:
    """One Argus dashboard: the shared tag, link menu and datasource variable, then its own variables."""
    return Dashboard(
        title=title,
        uid=uid,
        description=description,
        tags=[ARGUS_TAG],
        timezone="browser",
        time=Time(time_from, "now"),
        refresh=refresh,
        links=dashboard_links(),
        templating=Templating(list=[datasource_variable(), *variables]),
        annotations=annotations(incidents),
        panels=layout(panels),
    )
