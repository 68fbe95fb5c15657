"""The Grafana dashboards in dashboards/: they build, the committed JSON is fresh, every PromQL expression
parses (real promtool) and names only metrics that exist, and the required panels and variables are there.

Known metrics are never listed here: Argus's come from `ArgusMetrics().registry`, dcgm-exporter's from
collectors/dcgm_fields.py (the simulator serves that list), Ray's from dashboards/known_metrics/ray.txt (a
real scrape, kept honest by test_dashboards_real.py).

One file past 400 lines on purpose: the dashboards are one artifact and share these fixtures (built once).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import typer
from prometheus_client import CollectorRegistry, Gauge
from typer.testing import CliRunner

from argus.cli_dashboards import register
from argus.dashboards.build import SUFFIX, build_all, build_one, dashboard_files
from argus.dashboards.check import CheckReport, check_built, check_dashboards
from argus.dashboards.known_metrics import (
    RAY_METRICS_FILE,
    dcgm_metric_names,
    known_metrics,
    read_metric_list,
    recorded_ray_version,
)
from argus.dashboards.queries import queries_of, substitute, variable_promql, variable_samples
from argus.dashboards.ray_scrape import parse_exposition, sd_targets
from core.errors import ConfigError
from stage.sim.dcgm_exporter import DcgmExporterSim

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
RAY_LIST = DASHBOARDS / RAY_METRICS_FILE

# The panels issue 7 asks for, by title.
REQUIRED_PANELS = {
    "cluster.dashboard.py": [
        "GPU utilisation by node", "GPUs allocated vs busy", "Idle GPUs held by jobs", "GPU-hours by user",
        "GPU-hours by job", "Node health", "Interruptions per day by category",
    ],
    "job.dashboard.py": ["GPU utilisation", "GPU memory used", "GPU power", "GPU temperature", "Step rate"],
    "node.dashboard.py": [
        "GPU utilisation (DCGM)", "GPU memory used", "GPU temperature", "GPU power", "Xid errors (last Xid per GPU)",
        "NVLink bandwidth", "PCIe replays", "Ray node CPU", "Ray node memory", "Ray node disk",
    ],
    "argus.dashboard.py": [
        "Findings per category", "Incidents opened per category", "Open incidents per category",
        "Detection latency", "Actions and their results", "Collector errors",
    ],
}


@pytest.fixture(scope="module")
def checked() -> tuple[list, CheckReport]:
    return check_dashboards(DASHBOARDS)


@pytest.fixture(scope="module")
def dashboards(checked) -> dict[str, dict]:
    built, _ = checked
    return {b.name: b.data() for b in built}


def cli() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """argus"""

    register(app)
    return app


def titles(data: dict) -> list[str]:
    out = []
    for panel in data["panels"]:
        out.append(panel["title"])
        out += [p["title"] for p in panel.get("panels", [])]
    return out


def variable(data: dict, name: str) -> dict:
    found = [v for v in data["templating"]["list"] if v["name"] == name]
    assert found, f"no variable ${name}"
    return found[0]


def write_dashboard(folder: Path, name: str, body: str) -> Path:
    path = folder / f"{name}{SUFFIX}"
    path.write_text("from grafanalib.core import Dashboard, Target, TimeSeries, Templating, Template, GridPos\n" + body)
    return path


def one_panel(title: str, expr: str, *, variables: str = "[]") -> str:
    return (
        "dashboard = Dashboard(title='t', uid='t', templating=Templating(list=" + variables + "), panels=[\n"
        f"    TimeSeries(title={title!r}, gridPos=GridPos(h=8, w=12, x=0, y=0),\n"
        f"               targets=[Target(expr={expr!r}, refId='A')])])\n"
    )


# --- the committed dashboards ------------------------------------------------------------------------


def test_every_dashboard_builds(checked):
    built, _ = checked
    assert sorted(b.name for b in built) == sorted(REQUIRED_PANELS)
    assert [b.name for b in built] == [p.name for p in dashboard_files(DASHBOARDS)]
    for b in built:
        data = b.data()
        assert data["uid"] and data["title"].startswith("Argus / ")
        ids = [p["id"] for p in data["panels"]]
        assert len(ids) == len(set(ids)) and all(ids), f"{b.name}: panel ids must be unique"


def test_a_rebuild_is_byte_identical():
    for source in dashboard_files(DASHBOARDS):
        assert build_one(source).text == build_one(source).text


def test_committed_json_is_fresh():
    built, problems = build_all(DASHBOARDS)
    assert problems == []
    stale = [str(b.json_path.relative_to(ROOT)) for b in built if not b.is_fresh()]
    assert stale == [], "run `argus dashboards build` and commit the JSON"


def test_every_expression_parses_and_names_known_metrics(checked):
    _, report = checked
    assert report.queries > 60
    assert [str(p) for p in report.problems] == []


def test_cli_check_passes_on_the_committed_dashboards():
    result = CliRunner().invoke(cli(), ["dashboards", "build", "--check", "--dir", str(DASHBOARDS)])
    assert result.exit_code == 0, result.output
    assert "dashboards check passed" in result.output


@pytest.mark.parametrize("name", sorted(REQUIRED_PANELS))
def test_required_panels_exist(dashboards, name):
    missing = [t for t in REQUIRED_PANELS[name] if t not in titles(dashboards[name])]
    assert missing == []


def test_job_dashboard_has_the_submission_id_variable_and_incident_annotations(dashboards):
    job = dashboards["job.dashboard.py"]
    submission = variable(job, "submission_id")
    assert submission["type"] == "query"
    assert submission["query"] == "label_values(argus_job_gpus, submission_id)"
    assert submission["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    incidents = [a for a in job["annotations"]["list"] if a["name"] == "Incidents"]
    assert len(incidents) == 1
    annotation = incidents[0]
    assert annotation["enable"] and annotation["useValueForTime"]
    # Grafana reads the value as a time in milliseconds; the metric holds seconds
    assert annotation["expr"] == 'argus_incident_opened_timestamp_seconds{submission_id="$submission_id"} * 1000'
    # every job panel is about the chosen job
    for panel in job["panels"]:
        for target in panel.get("targets", []):
            assert "$submission_id" in target["expr"], panel["title"]


def test_node_dashboard_has_the_node_variable(dashboards):
    node = dashboards["node.dashboard.py"]
    assert variable(node, "node")["query"] == "label_values(ray_node_cpu_utilization, ip)"
    for panel in node["panels"]:
        for target in panel.get("targets", []):
            assert "$node" in target["expr"], panel["title"]


def test_every_query_reads_the_datasource_variable(dashboards):
    for name, data in dashboards.items():
        assert variable(data, "datasource")["type"] == "datasource"
        assert variable(data, "datasource")["query"] == "prometheus"
        for panel in data["panels"]:
            if panel["type"] == "row":
                continue
            assert panel["datasource"]["uid"] == "${datasource}", f"{name}: {panel['title']}"
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == "${datasource}", f"{name}: {panel['title']}"
        for annotation in data["annotations"]["list"]:
            assert annotation["datasource"]["uid"] == "${datasource}"


def test_panels_fit_the_grid_without_overlapping(dashboards):
    for name, data in dashboards.items():
        cells: set[tuple[int, int]] = set()
        for panel in data["panels"]:
            pos = panel["gridPos"]
            assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24, f"{name}: {panel['title']}"
            mine = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
            assert not cells & mine, f"{name}: {panel['title']} overlaps another panel"
            cells |= mine


def test_joins_to_jobs_derive_node_ip_from_instance(dashboards):
    # No Prometheus relabelling is needed: the DCGM side of a job join gets node_ip from `instance`.
    job = dashboards["job.dashboard.py"]
    expr = next(t["expr"] for p in job["panels"] if p["title"] == "GPU utilisation" for t in p["targets"])
    assert 'label_replace(DCGM_FI_DEV_GPU_UTIL, "node_ip", "$1", "instance", "([^:]+):.*")' in expr
    assert "on (node_ip)" in expr


def test_dcgm_names_the_dashboards_use_are_default_counters_the_simulator_serves(checked):
    _, report = checked
    used = {n for n in report.uses if n.startswith("DCGM_")}
    assert used, "the dashboards chart DCGM metrics"
    assert used <= dcgm_metric_names()
    served, _ = parse_exposition(DcgmExporterSim("node-a", gpus=2).render())
    assert used <= served


def test_argus_metric_names_come_from_the_registry():
    # A registry without argus_job_gpus: every panel reading it is reported, so nothing is hard-coded.
    registry = CollectorRegistry()
    Gauge("argus_incidents_open", "x", ("category",), registry=registry)
    built, _ = build_all(DASHBOARDS)
    report = check_built(built, known_metrics(DASHBOARDS, argus_registry=registry))
    unknown = [str(p) for p in report.problems if "'argus_job_gpus'" in p.message]
    assert any(p.startswith("job.dashboard.py: panel 'GPU utilisation', query A") for p in unknown)
    assert not any("'argus_incidents_open'" in p.message for p in report.problems)


# --- problems are reported with the panel's title ------------------------------------------------------


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture(scope="module")
def known():
    return known_metrics(DASHBOARDS)


def test_a_broken_expression_is_reported_with_its_panel(folder, known):
    write_dashboard(folder, "broken", one_panel("Broken panel", "sum(rate(up[5m])"))
    _, report = check_dashboards(folder, known=known)
    assert len(report.problems) == 1
    problem = str(report.problems[0])
    assert problem.startswith("broken.dashboard.py: panel 'Broken panel', query A: Prometheus cannot parse it")
    assert "unclosed left parenthesis" in problem


def test_an_unknown_metric_is_reported_with_its_panel(folder, known):
    write_dashboard(folder, "mystery", one_panel("Mystery panel", "rate(no_such_metric_total[5m]) / up"))
    _, report = check_dashboards(folder, known=known)
    assert [str(p).split(" (")[0] for p in report.problems] == [
        "mystery.dashboard.py: panel 'Mystery panel', query A: names unknown metric 'no_such_metric_total'"
    ]


def test_the_cli_names_the_panel_and_writes_nothing(folder):
    (folder / RAY_METRICS_FILE).parent.mkdir()
    shutil.copyfile(RAY_LIST, folder / RAY_METRICS_FILE)
    write_dashboard(folder, "mixed", one_panel("Mystery panel", "no_such_metric"))
    result = CliRunner().invoke(cli(), ["dashboards", "build", "--dir", str(folder)])
    assert result.exit_code == 2
    assert "panel 'Mystery panel'" in result.output and "no_such_metric" in result.output
    assert not (folder / "mixed.json").exists()


def test_build_writes_json_and_check_catches_stale_and_missing_json(folder):
    (folder / RAY_METRICS_FILE).parent.mkdir()
    shutil.copyfile(RAY_LIST, folder / RAY_METRICS_FILE)
    write_dashboard(folder, "tiny", one_panel("Targets up", "sum(up)"))
    runner = CliRunner()
    first = runner.invoke(cli(), ["dashboards", "build", "--dir", str(folder)])
    assert first.exit_code == 0, first.output
    written = (folder / "tiny.json").read_bytes()
    assert json.loads(written)["panels"][0]["targets"][0]["expr"] == "sum(up)"
    again = runner.invoke(cli(), ["dashboards", "build", "--dir", str(folder)])
    assert again.exit_code == 0 and "already up to date" in again.output
    assert (folder / "tiny.json").read_bytes() == written
    assert runner.invoke(cli(), ["dashboards", "build", "--check", "--dir", str(folder)]).exit_code == 0

    (folder / "tiny.json").write_bytes(written.replace(b"sum(up)", b"max(up)"))
    stale = runner.invoke(cli(), ["dashboards", "build", "--check", "--dir", str(folder)])
    assert stale.exit_code == 2 and "tiny.json" in stale.output and "stale" in stale.output
    assert b"max(up)" in (folder / "tiny.json").read_bytes()  # --check writes nothing

    (folder / "tiny.json").unlink()
    missing = runner.invoke(cli(), ["dashboards", "build", "--check", "--dir", str(folder)])
    assert missing.exit_code == 2 and "tiny.json" in missing.output


def test_variable_problems_are_reported(folder, known):
    variables = (
        "[Template(name='bad', query='up{job=\"x\"} by nonsense', type='query'),"
        " Template(name='agg', query='label_values(sum(up), job)', type='query'),"
        " Template(name='ok', query='label_values(up{job=~\".*ray.*\"}, instance)', type='query')]"
    )
    panel = one_panel("Uses a variable", 'up{instance="$ok", job="$nope"}', variables=variables)
    write_dashboard(folder, "vars", panel)
    _, report = check_dashboards(folder, known=known)
    messages = sorted(str(p) for p in report.problems)
    assert len(messages) == 3, messages
    assert messages[0].startswith("vars.dashboard.py: panel 'Uses a variable', query A: uses $nope")
    assert messages[1].startswith("vars.dashboard.py: variable $agg: label_values(...) takes a series selector")
    assert messages[2].startswith("vars.dashboard.py: variable $bad: is not a Grafana Prometheus variable query")


def test_a_variable_query_with_an_unknown_metric_is_reported(folder, known):
    variables = "[Template(name='node', query='label_values(nonexistent_metric, ip)', type='query')]"
    write_dashboard(folder, "v", one_panel("P", 'up{instance="$node"}', variables=variables))
    _, report = check_dashboards(folder, known=known)
    assert [str(p).split(" (")[0] for p in report.problems] == [
        "v.dashboard.py: variable $node: names unknown metric 'nonexistent_metric'"
    ]


def test_an_annotation_is_checked(folder, known):
    body = one_panel("P", "up").replace(
        "dashboard = Dashboard(title='t',",
        "from grafanalib.core import Annotations\n"
        "dashboard = Dashboard(annotations=Annotations(list=[{'name': 'Deploys', 'expr': 'deploy_time * 1000'}]),"
        " title='t',",
    )
    write_dashboard(folder, "ann", body)
    _, report = check_dashboards(folder, known=known)
    assert [str(p).split(" (")[0] for p in report.problems] == [
        "ann.dashboard.py: annotation 'Deploys': names unknown metric 'deploy_time'"
    ]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("raise RuntimeError('boom')\n", "failed to load: RuntimeError: boom"),
        ("def broken(:\n", "failed to load: SyntaxError"),
        ("x = 1\n", "defines no `dashboard`"),
        ("dashboard = {'title': 'a dict'}\n", "is a dict, not a grafanalib Dashboard"),
        ("dashboard = Dashboard(title='t', panels=[TimeSeries(title='P', targets=[Target(expr=object())])])\n",
         "cannot be written as JSON"),
        ("dashboard = Dashboard(title='t', panels=[TimeSeries(title='Empty', targets=[Target(refId='A')])])\n",
         None),
    ],
)
def test_a_bad_dashboard_file_is_reported_and_the_others_still_build(folder, known, body, message):
    write_dashboard(folder, "bad", body)
    write_dashboard(folder, "good", one_panel("Fine", "up"))
    built, report = check_dashboards(folder, known=known)
    assert [b.name for b in built] == (["good.dashboard.py"] if message else ["bad.dashboard.py", "good.dashboard.py"])
    assert len(report.problems) == 1
    problem = str(report.problems[0])
    if message:
        assert problem.startswith("bad.dashboard.py: file: ") and message in problem
    else:
        assert problem == "bad.dashboard.py: panel 'Empty', query A: has no PromQL expression"


def test_an_empty_or_absent_folder_is_an_error(folder):
    with pytest.raises(ConfigError, match="no \\*.dashboard.py files"):
        dashboard_files(folder)
    with pytest.raises(ConfigError, match="does not exist"):
        dashboard_files(folder / "nope")


def test_helpers_imported_from_one_folder_do_not_leak_into_another(tmp_path):
    for name, title in (("one", "First"), ("two", "Second")):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "shared_bits.py").write_text(f"TITLE = {title!r}\n")
        body = one_panel("x", "up").replace("'t'", "TITLE", 1)
        write_dashboard(folder, "d", "from shared_bits import TITLE\n" + body)
    assert build_one(tmp_path / "one" / f"d{SUFFIX}").data()["title"] == "First"
    assert build_one(tmp_path / "two" / f"d{SUFFIX}").data()["title"] == "Second"


# --- Grafana variables and known-metric files (the PromQL tokenizer: tests/detectors/test_promql.py) ---


def test_substitute_fills_grafana_variables_and_reports_unknown_ones():
    samples = {"node": "10.0.0.1", "__rate_interval": "4m"}
    text, unknown = substitute(
        'rate(x{instance=~"$node:.*", a="${node}", b="${node:regex}", c="[[node]]"}[$__rate_interval]) '
        '+ label_replace(y, "d", "$1", "s", "(.*)") + z{e="$missing"}',
        samples,
    )
    assert text == (
        'rate(x{instance=~"10.0.0.1:.*", a="10.0.0.1", b="10.0.0.1", c="10.0.0.1"}[4m]) '
        '+ label_replace(y, "d", "$1", "s", "(.*)") + z{e="sample"}'
    )
    assert unknown == ["missing"]


def test_variable_samples_follow_each_variable_kind():
    data = {"templating": {"list": [
        {"name": "idle", "type": "custom", "query": "5,10"},
        {"name": "step", "type": "interval", "query": "1m,5m"},
        {"name": "c", "type": "constant", "query": "abc"},
        {"name": "node", "type": "query", "query": "label_values(up, instance)"},
        {"name": "datasource", "type": "datasource", "query": "prometheus"},
        "not a variable",
        {"type": "query"},
    ]}}
    samples = variable_samples(data)
    assert (samples["idle"], samples["step"], samples["c"], samples["node"]) == ("5", "1m", "abc", "sample")
    assert samples["__range"] == "1h"


@pytest.mark.parametrize(
    ("query", "promql", "trouble"),
    [
        ("label_values(argus_job_gpus, submission_id)", "argus_job_gpus", None),
        ('label_values(up{job=~"a,b"}, instance)', 'up{job=~"a,b"}', None),
        ("label_values(job)", None, None),
        ("label_names()", None, None),
        ("query_result(topk(5, up))", "topk(5, up)", None),
        ("label_values(sum(up), job)", None, "takes a series selector"),
        ("label_values(up, )", None, "wants (series selector, label name)"),
        ("up", None, "is not a Grafana Prometheus variable query"),
    ],
)
def test_variable_promql(query, promql, trouble):
    got, problem = variable_promql(query)
    assert got == promql
    assert (problem is None) if trouble is None else (trouble in problem)


def test_queries_of_tolerates_odd_json():
    data = {
        "panels": [{"title": "Row", "type": "row",
                    "panels": [{"title": "Inner", "targets": [{"expr": "a", "refId": "B"}]}]},
                   "junk", {"title": "No targets"}, {"title": "Odd", "targets": ["x", {"refId": "C", "expr": 3}]}],
        "rows": [{"panels": [{"title": "Old row", "targets": [{"expr": "b"}]}]}],
        "templating": {"list": [{"name": "v", "type": "query", "query": {"query": "label_values(c, l)"}}]},
        "annotations": {"list": [{"name": "Builtin", "builtIn": 1}, {"name": "T", "target": {"expr": "d"}}, 5]},
    }
    queries, problems = queries_of("x.dashboard.py", data)
    assert [(q.where, q.text) for q in queries] == [
        ("panel 'Inner', query B", "a"),
        ("panel 'Old row', query ?", "b"),
        ("variable $v", "label_values(c, l)"),
        ("annotation 'T'", "d"),
    ]
    assert [str(p) for p in problems] == ["x.dashboard.py: panel 'Odd', query C: has no PromQL expression"]
    assert queries_of("y", {"panels": "nope", "templating": [], "annotations": None}) == ([], [])


def test_the_committed_ray_list_records_its_ray_version():
    names = read_metric_list(RAY_LIST)
    assert {"ray_node_cpu_utilization", "ray_node_mem_used", "ray_node_disk_usage", "ray_resources"} <= names
    assert recorded_ray_version(RAY_LIST)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("# only a comment\n", "lists no metric"),
        ("ray_ok\nnot a name\n", ":2: 'not a name' is not a metric name"),
        ("ray_ok\n9starts_with_digit\n", "is not a metric name"),
    ],
)
def test_a_malformed_known_metrics_file_is_an_error_naming_the_line(tmp_path, content, message):
    path = tmp_path / "ray.txt"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message.replace("(", "\\(")):
        read_metric_list(path)


def test_a_missing_or_binary_known_metrics_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        read_metric_list(tmp_path / "absent.txt")
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="cannot be read"):
        read_metric_list(tmp_path / "bin.txt")


def test_parse_exposition_reads_names_and_ray_versions_and_skips_junk():
    text = (
        "# HELP ray_x help\n# TYPE ray_x gauge\n"
        'ray_x{SessionName="s",Version="2.60.0",ip="1.2.3.4"} 1.0\n'
        "ray_y_total 3\n"
        "\n"
        "{weird line\n"
        '   \n'
        'process_cpu_seconds_total{Version="not ray"} 1\n'
    )
    names, versions = parse_exposition(text)
    assert names == {"ray_x", "ray_y_total", "process_cpu_seconds_total"}
    assert versions == {"2.60.0", "not ray"}


@pytest.mark.parametrize("content", ["not json", '{"targets": []}', '[{"targets": "x"}, 3]'])
def test_sd_targets_rejects_or_ignores_malformed_files(tmp_path, content):
    path = tmp_path / "sd.json"
    path.write_text(content)
    if content.startswith("["):
        assert sd_targets(path) == []
    else:
        with pytest.raises(ConfigError):
            sd_targets(path)


# --- argus dashboards ray-metrics, against real HTTP endpoints ------------------------------------------


@pytest.fixture
def fake_ray_endpoint():
    """A real /metrics endpoint serving Ray-shaped names (prometheus_client over HTTP)."""
    from prometheus_client import start_http_server

    from stage.localstack.ports import free_port

    registry = CollectorRegistry()
    Gauge("ray_node_cpu_utilization", "x", ("ip", "Version"), registry=registry).labels("10.0.0.1", "9.9.9").set(3)
    Gauge("ray_node_mem_used", "x", registry=registry).set(1)
    server, thread = start_http_server(free_port(), addr="127.0.0.1", registry=registry)
    yield f"127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def test_ray_metrics_writes_the_names_and_version_a_target_serves(tmp_path, fake_ray_endpoint):
    out = tmp_path / "known" / "ray.txt"
    result = CliRunner().invoke(cli(), ["dashboards", "ray-metrics", "--target", fake_ray_endpoint, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert read_metric_list(out) == {"ray_node_cpu_utilization", "ray_node_mem_used"}
    assert recorded_ray_version(out) == "9.9.9"


def test_ray_metrics_refuses_a_target_that_is_not_ray_or_not_there(tmp_path):
    out = tmp_path / "ray.txt"
    with DcgmExporterSim("node-a", gpus=1).start() as sim:
        not_ray = CliRunner().invoke(cli(), ["dashboards", "ray-metrics", "--target", f"127.0.0.1:{sim.port}",
                                             "--out", str(out)])
    assert not_ray.exit_code == 2 and "no Ray metric" in not_ray.output
    from stage.localstack.ports import free_port

    absent = CliRunner().invoke(cli(), ["dashboards", "ray-metrics", "--target", f"127.0.0.1:{free_port()}",
                                        "--out", str(out)])
    assert absent.exit_code == 2 and "cannot reach" in absent.output
    assert not out.exists()


def test_ray_metrics_without_a_target_says_to_name_one(tmp_path):
    """The product scrapes a running Ray; the throwaway local cluster is the stage's tool, named in the hint."""
    out = tmp_path / "ray.txt"
    result = CliRunner().invoke(cli(), ["dashboards", "ray-metrics", "--out", str(out)])
    assert result.exit_code == 2 and "--target" in result.output and "argus-stage ray-metrics" in result.output
    assert not out.exists()
