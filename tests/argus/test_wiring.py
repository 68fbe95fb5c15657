"""What `argus serve` runs for a given configuration: the registered collectors and detectors."""

from argus.incidents.desk import IncidentDesk
from argus.store.store import Store
from argus.wiring import build_detectors, build_pipeline
from core.settings import load_settings
from core.types import Severity, Signal, SignalKind, Subject, SubjectKind
from detectors.metric_rules import MetricRuleSet
from tests.support import T0
from tests.support.job_states import job_state


def names(pipeline):
    return [c.name for c in pipeline.collectors], [d.name for d in pipeline.detectors]


def test_minimal_configuration_watches_ray_only(tmp_path):
    settings = load_settings(data_dir=tmp_path, shared_root=tmp_path / "no-such-root")
    store = Store(settings.effective_database_url)
    collectors, detectors = names(build_pipeline(settings, IncidentDesk(store)))
    store.close()
    assert collectors == ["ray_state", "gpu_placement", "ray_logs", "rank_stacks"]  # rank_stacks: hang_stacks is on
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


def test_the_hosts_kernel_log_is_read_only_when_asked(tmp_path):
    store = Store(load_settings(data_dir=tmp_path).effective_database_url)
    assert "kernel_log" not in names(build_pipeline(load_settings(data_dir=tmp_path), IncidentDesk(store)))[0]
    settings = load_settings(data_dir=tmp_path, kernel_log=str(tmp_path / "kern.log"), kernel_log_node_ip="10.0.0.7")
    pipeline = build_pipeline(settings, IncidentDesk(store))
    store.close()
    kernel = [c for c in pipeline.collectors if c.name == "kernel_log"]
    assert len(kernel) == 1 and kernel[0].node_ip == "10.0.0.7"


def test_detectors_whose_recoveries_need_a_source_skip_ticks_without_it(tmp_path):
    """A rule Prometheus could not evaluate has not stopped holding; a job status Ray did not report is not a job
    running again: those detectors skip the tick (argus.pipeline), so neither can close an incident."""
    settings = load_settings(data_dir=tmp_path, shared_root=tmp_path / "no-such-root", prometheus_url="http://prom:9090")
    store = Store(settings.effective_database_url)
    pipeline = build_pipeline(settings, IncidentDesk(store))
    store.close()
    assert pipeline.needs["metric_rules"] == {"metric_rules"}
    assert pipeline.needs["job_failure"] == pipeline.needs["lost_node"] == {"ray_state"}


def test_the_log_rule_detector_keeps_a_jobs_open_findings_in_the_memory_given(tmp_path):
    """With the store's detector state as memory (as `argus serve` runs it), a job's error reported before a restart
    closes at warning when the job succeeds after it."""
    settings = load_settings(data_dir=tmp_path, shared_root=tmp_path / "no-such-root")
    store = Store(settings.effective_database_url)

    def log_rules():
        return next(d for d in build_detectors(settings, MetricRuleSet(), memory=store.detector_state)
                    if d.name == "log_rules")

    oom = Signal(kind=SignalKind.LOG_LINE, source="/s/jobs/job-1/logs/train.log", text="torch.OutOfMemoryError: "
                 "CUDA out of memory. Tried to allocate 2.00 GiB", line=7, observed_at=T0, attrs={"stream": "job-logs"},
                 subject=Subject(kind=SubjectKind.JOB, id="job-1"))
    [reported] = log_rules().detect([job_state("job-1", "RUNNING"), oom])
    after = log_rules()  # restarted
    after.detect([job_state("job-1", "SUCCEEDED")])
    [recovery] = after.recoveries()
    store.close()
    assert recovery.fingerprint == reported.fingerprint and recovery.severity is Severity.WARNING


def test_node_agents_get_an_inbox_a_fleet_and_a_token_kept_in_the_data_dir(tmp_path):
    from argus.agents.fleet import TOKEN_FILE
    from argus.exporter import ArgusMetrics
    from argus.wiring import build_control, build_node_agents

    settings = load_settings(data_dir=tmp_path, node_agents=True, node_agent_url="http://10.0.0.1:8600",
                             node_agent_kernel_log="/var/log/nodes/{node_ip}/kern.log")
    store = Store(settings.effective_database_url)
    inbox, fleet = build_node_agents(settings, store, build_control(settings, store), ArgusMetrics())
    token = (tmp_path / TOKEN_FILE).read_text()
    assert store.verify_token(token).role.value == "node_agent"
    store.close()
    assert fleet.env["ARGUS_AGENT_CENTRAL_URL"] == "http://10.0.0.1:8600"
    assert fleet.env["ARGUS_AGENT_TOKEN"] == token
    assert fleet.env["ARGUS_AGENT_KERNEL_LOG"] == "/var/log/nodes/{node_ip}/kern.log"
    assert inbox.covered() == set()
