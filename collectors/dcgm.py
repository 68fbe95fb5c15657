"""Reads dcgm-exporter's /metrics text: per-GPU samples, and a collector that scrapes exporters directly.

`DcgmScrapeCollector` is for clusters without Prometheus; with Prometheus, the same series come from the
Prometheus collector instead. One exporter being down never hides the others: each scrape yields an `up`
signal (1 or 0) per target, and the reason a target failed is kept in `last_errors`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import httpx
from loguru import logger
from prometheus_client.parser import text_string_to_metric_families

from core import signal_keys as keys
from core.errors import ArgusError, ConfigError, InputError, SourceUnavailable
from core.types import Signal, SignalKind, Subject, SubjectKind, utcnow

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024  # 8 GPUs with Kubernetes/HPC labels stay well under 1 MiB
UP_METRIC = "up"
_HOSTNAME_LABELS = ("Hostname", "hostname")  # "hostname" on dcgm-exporter's main branch since 2026
_UUID_LABELS = ("UUID", "uuid")  # "uuid" with --use-old-namespace


@dataclass(frozen=True)
class GpuSample:
    """One value of one DCGM field for one GPU (or one MIG instance of it: see labels GPU_I_ID)."""

    hostname: str
    gpu: int
    uuid: str
    model_name: str
    metric: str
    value: float
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    source: str = ""

    @property
    def subject(self) -> Subject:
        return gpu_subject(self.hostname, self.gpu, self.uuid)

    def to_signal(self, observed_at: datetime | None = None) -> Signal:
        return Signal(
            kind=SignalKind.METRIC,
            source=self.source,
            subject=self.subject,
            observed_at=observed_at or utcnow(),
            value=self.value,
            attrs={
                keys.METRIC: self.metric,
                keys.HOSTNAME: self.hostname,
                keys.GPU: self.gpu,
                keys.UUID: self.uuid,
                keys.MODEL_NAME: self.model_name,
                keys.LABELS: dict(self.labels),
            },
        )


def gpu_subject(hostname: str, gpu: int, uuid: str) -> Subject:
    return Subject(kind=SubjectKind.GPU, id=uuid, name=f"{hostname}/gpu{gpu}")


def parse_dcgm_metrics(text: str, *, source: str, default_hostname: str = "") -> list[GpuSample]:
    """Per-GPU DCGM samples from exposition text; InputError naming `source` if the text is malformed.

    Series without a `gpu` and `UUID` label (NVLink-, NvSwitch- or CPU-level ones, other exporters'
    metrics) are skipped. `default_hostname` is used when the exporter runs without its Hostname label.
    """
    samples: list[GpuSample] = []
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as exc:  # the parser raises bare ValueError/IndexError with little text
        raise _malformed(text, source, exc) from None
    for family in families:
        for sample in family.samples:
            # The parser appends "_total" to counter samples; the family keeps the exporter's name.
            name = family.name if family.type == "counter" else sample.name
            if not name.startswith("DCGM_"):
                continue
            parsed = _gpu_sample(name, sample.labels, sample.value, source, default_hostname)
            if parsed is not None:
                samples.append(parsed)
    return samples


def _gpu_sample(
    name: str, labels: dict[str, str], value: float, source: str, default_hostname: str
) -> GpuSample | None:
    uuid = next((labels[k] for k in _UUID_LABELS if k in labels), None)
    if "gpu" not in labels or uuid is None:
        return None
    try:
        index = int(labels["gpu"])
    except ValueError:
        raise InputError(
            f"dcgm-exporter output from {source} has a non-numeric gpu label {labels['gpu']!r} on {name}",
            hint="is this really dcgm-exporter? its gpu label is the GPU index",
        ) from None
    hostname = next((labels[k] for k in _HOSTNAME_LABELS if k in labels), default_hostname)
    return GpuSample(
        hostname=hostname,
        gpu=index,
        uuid=uuid,
        model_name=labels.get("modelName", ""),
        metric=name,
        value=float(value),
        labels=dict(labels),
        source=source,
    )


def _malformed(text: str, source: str, exc: Exception) -> InputError:
    where = _first_bad_line(text)
    detail = f" at line {where[0]}: {where[1]!r}" if where else f": {exc}"
    return InputError(
        f"metrics from {source} are not valid Prometheus text{detail}",
        hint="check that the URL is dcgm-exporter's /metrics (default port 9400), not a proxy or web page",
    )


def _first_bad_line(text: str) -> tuple[int, str] | None:
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            list(text_string_to_metric_families(line + "\n"))
        except Exception:
            return number, line[:160]
    return None


class DcgmScrapeCollector:
    """Scrapes dcgm-exporter `/metrics` URLs; implements core.ports.Collector.

    `collect()` never raises for a failed target: it returns the samples of the targets that answered,
    an `up` signal per target (value 1 or 0), and keeps each failure (SourceUnavailable for a target that
    cannot be reached or answers with an HTTP error, InputError for malformed text) in `last_errors`.
    """

    name = "dcgm"

    def __init__(
        self,
        targets: Iterable[str],
        *,
        timeout_s: float = 10.0,
        http_client: httpx.Client | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        self.targets = [_check_target(t) for t in targets]
        if not self.targets:
            raise ConfigError(
                "no dcgm-exporter targets given", hint="pass URLs such as http://worker-1:9400/metrics"
            )
        if timeout_s <= 0:
            raise ConfigError(f"timeout_s={timeout_s} must be > 0", hint="e.g. 10")
        if max_body_bytes <= 0:
            raise ConfigError(f"max_body_bytes={max_body_bytes} must be > 0", hint="e.g. 8 MiB")
        self.timeout_s = timeout_s
        self.max_body_bytes = max_body_bytes
        self._client = http_client or httpx.Client()
        self._owns_client = http_client is None
        self.last_errors: dict[str, ArgusError] = {}

    def scrape(self, url: str) -> list[GpuSample]:
        """One target's samples; raises SourceUnavailable or InputError naming the URL."""
        text = self._fetch(url)
        return parse_dcgm_metrics(text, source=url, default_hostname=urlsplit(url).hostname or "")

    def collect(self) -> list[Signal]:
        signals: list[Signal] = []
        errors: dict[str, ArgusError] = {}
        for url in self.targets:
            observed_at = utcnow()
            try:
                samples = self.scrape(url)
            except (SourceUnavailable, InputError) as exc:
                errors[url] = exc
                logger.warning("dcgm-exporter target {} failed: {}", url, exc)
                signals.append(_up_signal(url, 0.0, observed_at, str(exc)))
                continue
            signals.append(_up_signal(url, 1.0, observed_at, None))
            signals.extend(s.to_signal(observed_at) for s in samples)
        self.last_errors = errors
        return signals

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> DcgmScrapeCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fetch(self, url: str) -> str:
        hint = "check that dcgm-exporter runs on that node and listens on that address (default port 9400)"
        try:
            with self._client.stream("GET", url, timeout=self.timeout_s) as response:
                if response.status_code != 200:
                    raise SourceUnavailable(
                        "dcgm-exporter",
                        url,
                        f"HTTP {response.status_code} {response.reason_phrase}",
                        hint=hint,
                    )
                declared = response.headers.get("Content-Length")
                if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
                    raise self._too_big(url, f"declares {declared} bytes")
                body = bytearray()
                for chunk in response.iter_bytes():
                    body.extend(chunk)
                    if len(body) > self.max_body_bytes:
                        raise self._too_big(url, f"sent more than {self.max_body_bytes} bytes")
        except httpx.TimeoutException:
            raise SourceUnavailable(
                "dcgm-exporter", url, f"no answer within {self.timeout_s:g} s", hint=hint
            ) from None
        except httpx.HTTPError as exc:
            raise SourceUnavailable("dcgm-exporter", url, _describe(exc), hint=hint) from None
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(
                f"metrics from {url} are not UTF-8 text (byte {exc.start})",
                hint="check that the URL points at dcgm-exporter's /metrics",
            ) from None

    def _too_big(self, url: str, what: str) -> InputError:
        return InputError(
            f"response from {url} is too large: it {what}, the limit is {self.max_body_bytes} bytes",
            hint="check that the URL is dcgm-exporter's /metrics, or raise max_body_bytes",
        )


def _up_signal(url: str, value: float, observed_at: datetime, error: str | None) -> Signal:
    parts = urlsplit(url)
    attrs: dict[str, Any] = {"metric": UP_METRIC, "exporter": "dcgm-exporter", "target": url}
    if error is not None:
        attrs["error"] = error
    return Signal(
        kind=SignalKind.METRIC,
        source=url,
        subject=Subject(kind=SubjectKind.NODE, id=parts.hostname or url, name=parts.netloc or url),
        observed_at=observed_at,
        value=value,
        attrs=attrs,
    )


def _check_target(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"dcgm-exporter target {url!r} is not an http(s) URL",
            hint="write it as http://<node>:9400/metrics",
        )
    return url


def _describe(exc: httpx.HTTPError) -> str:
    cause = exc.__context__ or exc.__cause__
    text = str(exc) or type(exc).__name__
    if cause is not None and str(cause) and str(cause) not in text:
        text = f"{text} ({cause})"
    return text
