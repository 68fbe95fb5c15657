"""Argus itself: findings and incidents per category, detection latency, actions and their results,
notifications, collector errors and the detection loop. Built by `argus dashboards build`."""

from argus_panels import (
    argus_dashboard,
    incident_annotation,
    row,
    stat,
    table,
    target,
    targets,
    timeseries,
)


def latency_quantile(q: str, window: str, by: str = "le, category") -> str:
    return f"histogram_quantile({q}, sum by ({by}) (increase(argus_detection_latency_seconds_bucket[{window}])))"


panels = [
    row("Detection"),
    stat("Open incidents", [target("sum(argus_incidents_open)")]),
    stat("Findings in range", [target("sum(increase(argus_findings_total[$__range]))")]),
    stat("Seconds since the last loop tick", [target("time() - max(argus_loop_last_tick_timestamp_seconds)")],
         unit="s", no_value="never ticked",
         description="Argus's detection loop stamps every tick; a growing value means the loop is stuck."),
    stat("Collectors down", [target("count(argus_collector_up == 0) or vector(0)")],
         description="Collectors whose last poll could not reach their source."),
    timeseries(
        "Findings per category",
        targets(("sum by (category) (increase(argus_findings_total[$__rate_interval]))", "{{category}}")),
        bars=True, stacked=True, legend_table=True,
    ),
    timeseries(
        "Incidents opened per category",
        targets(("sum by (category) (increase(argus_incidents_opened_total[$__rate_interval]))", "{{category}}")),
        bars=True, stacked=True, legend_table=True,
    ),
    timeseries(
        "Open incidents per category",
        targets(("sum by (category) (argus_incidents_open)", "{{category}}")),
        stacked=True, legend_table=True, description="Incidents open or being mitigated.",
    ),
    timeseries(
        "Detection latency",
        targets(
            (latency_quantile("0.5", "1h"), "p50 {{category}}"),
            (latency_quantile("0.95", "1h"), "p95 {{category}}"),
        ),
        unit="s", legend_table=True,
        description="From a fault's first evidence to Argus's finding, per category, over the last hour.",
    ),
    table(
        "Detection latency over the range",
        [
            target(latency_quantile("0.5", "$__range"), ref="A", instant=True, table=True),
            target(latency_quantile("0.95", "$__range"), ref="B", instant=True, table=True),
            target("sum by (category) (increase(argus_detection_latency_seconds_count[$__range]))", ref="C",
                   instant=True, table=True),
        ],
        rename={"Value #A": "p50 (s)", "Value #B": "p95 (s)", "Value #C": "findings"},
        width=24, height=6,
    ),
    row("Remediation and notifications"),
    timeseries(
        "Actions and their results",
        targets(("sum by (kind, outcome) (increase(argus_actions_total[$__rate_interval]))", "{{kind}} {{outcome}}")),
        bars=True, stacked=True, legend_table=True,
        description="Remediation steps (drain, resubmit, keep scene, stop) by their outcome.",
    ),
    table(
        "Actions in range",
        [target("sum by (kind, outcome) (increase(argus_actions_total[$__range]))", instant=True, table=True)],
        rename={"Value": "actions"}, sort_by="actions",
    ),
    timeseries(
        "Notifications",
        targets(("sum by (channel, outcome) (increase(argus_notifications_total[$__rate_interval]))",
                 "{{channel}} {{outcome}}")),
        bars=True, stacked=True, legend_table=True,
    ),
    timeseries("Argus up", targets(('up{job=~".*argus.*"}', "{{instance}}")), max_value=1,
               description="Whether Prometheus can scrape Argus's /metrics (scrape job named like '*argus*')."),
    row("Collectors and loop"),
    timeseries(
        "Collector errors",
        targets(("sum by (collector) (increase(argus_collector_errors_total[$__rate_interval]))", "{{collector}}")),
        bars=True, stacked=True, legend_table=True,
    ),
    timeseries("Collectors up", targets(("argus_collector_up", "{{collector}}")), max_value=1, legend_table=True,
               description="1: the collector reached its source on its last poll; 0: it did not."),
    timeseries(
        "Loop tick duration",
        targets(
            ("histogram_quantile(0.5, sum by (le) (rate(argus_loop_tick_duration_seconds_bucket[$__rate_interval])))",
             "p50"),
            ("histogram_quantile(0.95, sum by (le) (rate(argus_loop_tick_duration_seconds_bucket[$__rate_interval])))",
             "p95"),
        ),
        unit="s",
    ),
    timeseries("Seconds since the last tick", targets(("time() - argus_loop_last_tick_timestamp_seconds", "lag")),
               unit="s"),
]

dashboard = argus_dashboard(
    "Argus / Argus", "argus-self",
    "Argus's own health: what it finds, how fast, what it does about it, and whether it can see.",
    panels, incidents=incident_annotation(enabled=False),
)
