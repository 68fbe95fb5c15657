"""What `argus serve` runs for a given configuration: the registered collectors and detectors."""

from argus.incidents.desk import IncidentDesk
from argus.store.store import Store
from argus.wiring import build_pipeline
from core.settings import load_settings


def names(pipeline):
    return [c.name for c in pipeline.collectors], [d.name for d in pipeline.detectors]


def test_minimal_configuration_watches_ray_only(tmp_path):
    settings = load_settings(data_dir=tmp_path, shared_root=tmp_path / "no-such-root")
    store = Store(settings.effective_database_url)
    collectors, detectors = names(build_pipeline(settings, IncidentDesk(store)))
    store.close()
    assert collectors == ["ray_state", "gpu_placement", "ray_logs"]
    assert {"lost_node", "log_rules", "job_failure", "stall", "idle_gpu", "disk_space"} <= set(detectors)
    assert "metric_rules" not in detectors  # no Prometheus, no PromQL to evaluate


def test_full_configuration(tmp_path):
    (tmp_path / "shared" / "jobs").mkdir(parents=True)
    settings = load_settings(data_dir=tmp_path, shared_root=tmp_path / "shared", prometheus_url="http://prom:9090")
    store = Store(settings.effective_database_url)
    collectors, detectors = names(build_pipeline(settings, IncidentDesk(store)))
    store.close()
    assert {"job_logs", "storage", "prometheus", "metric_rules", "dcgm_prometheus"} <= set(collectors)
    assert "metric_rules" in detectors


def test_direct_dcgm_scrape_or_nvml_without_prometheus(tmp_path):
    settings = load_settings(data_dir=tmp_path, dcgm_targets=["http://10.0.0.3:9400/metrics"], nvml=True)
    store = Store(settings.effective_database_url)
    collectors, _ = names(build_pipeline(settings, IncidentDesk(store)))
    assert "dcgm" in collectors and "nvml" not in collectors  # an exporter beats NVML
    settings = load_settings(data_dir=tmp_path, nvml=True)
    assert "nvml" in names(build_pipeline(settings, IncidentDesk(store)))[0]
    store.close()


def test_detectors_whose_recoveries_need_a_source_skip_ticks_without_it(tmp_path):
    """A rule Prometheus could not evaluate has not stopped holding; a job status Ray did not report is not a job
    running again: those detectors skip the tick (argus.pipeline), so neither can close an incident."""
    settings = load_settings(data_dir=tmp_path, shared_root=tmp_path / "no-such-root", prometheus_url="http://prom:9090")
    store = Store(settings.effective_database_url)
    pipeline = build_pipeline(settings, IncidentDesk(store))
    store.close()
    assert pipeline.needs["metric_rules"] == {"metric_rules"}
    assert pipeline.needs["job_failure"] == pipeline.needs["lost_node"] == {"ray_state"}
