"""Reading dcgm-exporter output: a real exporter's sample, the simulator over HTTP, and failing targets."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from collectors.dcgm import DcgmScrapeCollector, GpuSample, parse_dcgm_metrics
from core.errors import ConfigError, InputError, SourceUnavailable
from core.ports import Collector
from core.types import SignalKind, SubjectKind
from stage.sim.dcgm_exporter import DcgmExporterSim

REAL_SAMPLE = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm" / "real_exporter_sample.txt"


def _free_port() -> int:
    """A loopback port nothing listens on: bound to find it, then released."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(body: bytes, *, status: int = 200, declare_length: bool = True) -> Iterator[str]:
    """A plain HTTP server on loopback answering every GET with `body`; yields its /metrics URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            if declare_length:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the collector hangs up once it has seen enough

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def test_parses_a_real_dcgm_exporter_sample():
    samples = parse_dcgm_metrics(REAL_SAMPLE.read_text(), source="fixture")
    assert len(samples) == 8
    gr = [s for s in samples if s.metric == "DCGM_FI_PROF_GR_ENGINE_ACTIVE"]
    assert {s.hostname for s in gr} == {"gsrh100-074"}
    assert {s.uuid for s in gr} == {"GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77"}
    assert {s.model_name for s in gr} == {"NVIDIA H100 80GB HBM3"}
    # MIG instances and Kubernetes pod labels stay in labels for the detectors that want them.
    assert sorted(s.labels["GPU_I_ID"] for s in gr) == ["7", "8", "9"]
    assert gr[0].labels["pod"].startswith("text-embedding-predictor")
    temps = {
        s.gpu: s.value
        for s in samples
        if s.metric == "DCGM_FI_DEV_MEMORY_TEMP" and "GPU_I_ID" not in s.labels
    }
    assert temps == {1: 42.0, 2: 38.0, 3: 41.0}


def test_parses_the_simulator_and_keeps_counter_names_as_the_exporter_writes_them():
    with DcgmExporterSim("node-a", gpus=2) as sim:
        sim.set_gpu(1, util=93, xid=79)
        url = sim.metrics_url
        with DcgmScrapeCollector([url], timeout_s=30) as collector:
            samples = collector.scrape(url)
    names = {s.metric for s in samples}
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" in names  # not ..._total, as the parser renames counters
    assert "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" in names
    assert len(samples) == 25 * 2
    by_key = {(s.gpu, s.metric): s for s in samples}
    assert by_key[(1, "DCGM_FI_DEV_GPU_UTIL")].value == 93
    assert by_key[(1, "DCGM_FI_DEV_XID_ERRORS")].labels["err_code"] == "79"
    assert by_key[(0, "DCGM_FI_DEV_GPU_UTIL")].hostname == "node-a"
    assert by_key[(0, "DCGM_FI_DEV_GPU_UTIL")].source == url


def test_a_sample_becomes_a_gpu_metric_signal():
    sample = GpuSample(
        hostname="w1",
        gpu=3,
        uuid="GPU-x",
        model_name="NVIDIA H100 80GB HBM3",
        metric="DCGM_FI_DEV_GPU_UTIL",
        value=42.0,
        labels={"gpu": "3"},
        source="http://w1:9400/metrics",
    )
    signal = sample.to_signal()
    assert signal.kind is SignalKind.METRIC
    assert signal.subject.kind is SubjectKind.GPU
    assert signal.subject.id == "GPU-x"
    assert signal.subject.name == "w1/gpu3"
    assert signal.value == 42.0
    assert signal.source == "http://w1:9400/metrics"
    assert signal.attrs["metric"] == "DCGM_FI_DEV_GPU_UTIL"
    assert signal.attrs["labels"] == {"gpu": "3"}


def test_series_without_gpu_identity_are_skipped():
    text = (
        "# TYPE go_goroutines gauge\ngo_goroutines 12\n"
        'DCGM_FI_DEV_NVLINK_BANDWIDTH_L0{nvlink="0",gpu="0"} 5\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",uuid="GPU-old",device="nvidia0"} 7\n'
    )
    samples = parse_dcgm_metrics(text, source="t", default_hostname="fallback")
    assert [(s.metric, s.uuid, s.hostname) for s in samples] == [
        ("DCGM_FI_DEV_GPU_UTIL", "GPU-old", "fallback")
    ]


@pytest.mark.parametrize(
    "text, needle",
    [
        ("<html><body>502 Bad Gateway</body></html>\n", "line 1"),
        ('# HELP DCGM_FI_DEV_GPU_UTIL x\nDCGM_FI_DEV_GPU_UTIL{gpu="0" 5\n', "line 2"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="zero",UUID="GPU-1"} 5\n', "non-numeric gpu label"),
    ],
)
def test_malformed_text_is_an_input_error_naming_the_source(text, needle):
    with pytest.raises(InputError) as info:
        parse_dcgm_metrics(text, source="http://w9:9400/metrics")
    assert "http://w9:9400/metrics" in info.value.message
    assert needle in info.value.message
    assert info.value.hint


def test_a_down_target_is_reported_by_url_while_the_others_still_answer():
    dead = f"http://127.0.0.1:{_free_port()}/metrics"
    with DcgmExporterSim("node-a", gpus=2) as a, DcgmExporterSim("node-b", gpus=4) as b:
        b.set_gpu(2, xid=48)
        url_a, url_b = a.metrics_url, b.metrics_url
        collector = DcgmScrapeCollector([url_a, dead, url_b], timeout_s=30)
        assert isinstance(collector, Collector)
        with collector:
            signals = collector.collect()
    up = {s.attrs["target"]: s.value for s in signals if s.attrs["metric"] == "up"}
    assert up == {url_a: 1.0, dead: 0.0, url_b: 1.0}
    gpu_signals = [s for s in signals if s.subject.kind is SubjectKind.GPU]
    assert {s.subject.name.split("/")[0] for s in gpu_signals} == {"node-a", "node-b"}
    assert len(gpu_signals) == 25 * (2 + 4)
    xid = [s for s in gpu_signals if s.attrs["metric"] == "DCGM_FI_DEV_XID_ERRORS" and s.value == 48]
    assert [s.subject.name for s in xid] == ["node-b/gpu2"]
    assert list(collector.last_errors) == [dead]
    error = collector.last_errors[dead]
    assert isinstance(error, SourceUnavailable)
    assert error.address == dead and dead in str(error)
    down_signal = next(s for s in signals if s.attrs["metric"] == "up" and s.value == 0.0)
    assert dead in down_signal.attrs["error"]


def test_a_stopped_exporter_is_down_even_for_a_client_with_a_kept_alive_connection():
    client = httpx.Client()
    try:
        sim = DcgmExporterSim("node-s", gpus=1).start()
        url = sim.metrics_url
        collector = DcgmScrapeCollector([url], timeout_s=30, http_client=client)
        assert [s.value for s in collector.collect() if s.attrs["metric"] == "up"] == [1.0]
        sim.stop()
        assert [s.value for s in collector.collect() if s.attrs["metric"] == "up"] == [0.0]
        assert isinstance(collector.last_errors[url], SourceUnavailable)
        collector.close()
        assert not client.is_closed  # a client passed in belongs to the caller
    finally:
        client.close()


def test_errors_are_forgotten_once_the_target_answers_again():
    port = _free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    with DcgmScrapeCollector([url], timeout_s=30) as collector:
        collector.collect()
        assert url in collector.last_errors
        with DcgmExporterSim("node-r", gpus=1, port=port):
            signals = collector.collect()
    assert collector.last_errors == {}
    assert next(s.value for s in signals if s.attrs["metric"] == "up") == 1.0


def test_http_errors_and_garbage_are_recorded_per_target():
    with serve(b"not found", status=404) as missing, serve(b"<html>login</html>\n") as html:
        with DcgmScrapeCollector([missing, html], timeout_s=30) as collector:
            signals = collector.collect()
            with pytest.raises(SourceUnavailable, match="HTTP 404"):
                collector.scrape(missing)
    assert [s.value for s in signals] == [0.0, 0.0]
    assert isinstance(collector.last_errors[missing], SourceUnavailable)
    assert isinstance(collector.last_errors[html], InputError)
    assert html in collector.last_errors[html].message


@pytest.mark.parametrize("declare_length", [True, False])
def test_huge_bodies_are_capped(declare_length):
    body = b'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1"} 1\n' * 50_000  # ~2.3 MB
    with serve(body, declare_length=declare_length) as url:
        with DcgmScrapeCollector([url], timeout_s=30, max_body_bytes=1024 * 1024) as collector:
            with pytest.raises(InputError, match="too large") as info:
                collector.scrape(url)
    assert url in info.value.message


def test_bad_targets_are_config_errors():
    with pytest.raises(ConfigError, match="no dcgm-exporter targets"):
        DcgmScrapeCollector([])
    with pytest.raises(ConfigError, match="not an http"):
        DcgmScrapeCollector(["worker-1:9400"])
