"""Grafana dashboards as code: building dashboards/*.dashboard.py to JSON and checking every expression.

The library behind `argus dashboards build [--check]` and `argus dashboards ray-metrics` (argus/cli_dashboards.py):

- build: import every dashboards/*.dashboard.py (grafanalib's convention: the file defines `dashboard`) and
  render <name>.json beside it (sorted keys, so a rebuild is byte-identical);
- queries: every PromQL expression in a dashboard's JSON (panel queries, variable queries such as
  label_values(...), annotations), with Grafana variables replaced by sample values;
- known_metrics: the metrics a dashboard may name: Ray's (dashboards/known_metrics/ray.txt, from a real
  scrape), dcgm-exporter's default counters (collectors/dcgm_fields.py), Argus's own (whatever
  `ArgusMetrics().registry` exports) and Prometheus's `up`;
- check: each expression is parsed by `promtool check rules` (as a recording rule in a temporary file) and
  every metric it names must be known; `--check` writes nothing and also fails when a committed JSON
  differs from a fresh build;
- ray_scrape: Ray's metric names from a real scrape, for `ray-metrics`, of the targets named with --target
  (a throwaway local cluster is the stage's tool: `argus-stage ray-metrics`, stage/localstack/ray_metrics.py).
"""
