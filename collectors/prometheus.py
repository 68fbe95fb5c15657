"""Prometheus: which scrape targets are up (Ray's nodes, dcgm-exporters), read with prometheus-api-client.

A target that Prometheus cannot scrape is often the first sign of a lost node or a dead exporter, and the
query itself tells the API whether Prometheus is reachable at all.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from core import signal_keys as keys
from core.errors import InputError, SourceUnavailable
from core.types import Signal, SignalKind, Subject, SubjectKind, utcnow

_HINT = "check that Prometheus is running and that ARGUS_PROMETHEUS_URL points at it (http://<host>:9090)"


def _retry() -> Any:
    """The library's retry (3 tries, on 408/429/5xx), less its waits on a refused connection: those slept 2 s, then
    4 s, so a down Prometheus held each query 6 s (each daemon tick, and Ctrl-C behind it); the next tick is the
    retry. Answers that ask for a retry still get one, after a short back-off."""
    from urllib3.util.retry import Retry

    return Retry(total=3, connect=0, backoff_factor=0.2, status_forcelist=[408, 429, 500, 502, 503, 504])


class PrometheusClient:
    """The queries Argus makes, over prometheus-api-client, with its errors wrapped into ours."""

    def __init__(self, url: str, *, timeout_s: float = 10.0, connect: Any = None) -> None:
        from prometheus_api_client import PrometheusConnect

        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._prom = connect or PrometheusConnect(url=self.url, disable_ssl=True, timeout=timeout_s, retry=_retry())

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query: a list of {"metric": labels, "value": [ts, "v"]}."""
        from prometheus_api_client.exceptions import PrometheusApiClientException

        try:
            return list(self._prom.custom_query(promql, timeout=self.timeout_s))
        except PrometheusApiClientException as exc:
            # Prometheus answered, and refused the query: the query is wrong, not the server
            raise InputError(f"Prometheus at {self.url} rejected the query {promql!r}: {exc}",
                             hint="check the PromQL") from exc
        except Exception as exc:  # requests' connection errors, timeouts, bad JSON from a proxy
            cause = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            raise SourceUnavailable("Prometheus", self.url, cause, hint=_HINT) from exc


    def query_range(self, promql: str, start: datetime, end: datetime, step_s: float) -> list[dict[str, Any]]:
        """A range query: a list of {"metric": labels, "values": [[ts, "v"], ...]}."""
        from prometheus_api_client.exceptions import PrometheusApiClientException

        params = {"query": promql, "start": start.timestamp(), "end": end.timestamp(), "step": step_s}
        # prometheus-api-client rounds both ends to whole seconds: rounded down, `end` could fall before the
        # newest sample and lose it. A second more costs at most one extra step.
        end = end + timedelta(seconds=1)
        try:
            # the step in plain seconds: Prometheus takes "2.5" but refuses "2.5s" (a duration has no fraction)
            return list(self._prom.custom_query_range(
                promql, start_time=start, end_time=end, step=f"{step_s:g}", timeout=self.timeout_s))
        except PrometheusApiClientException as exc:
            raise InputError(f"Prometheus at {self.url} rejected the range query {params}: {exc}",
                             hint="check the PromQL") from exc
        except Exception as exc:  # noqa: BLE001 - connection errors, timeouts, bad JSON from a proxy
            cause = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            raise SourceUnavailable("Prometheus", self.url, cause, hint=_HINT) from exc


class PrometheusTargetsCollector:
    """One METRIC signal per scrape target: `up` (1 or 0) with the target's job and instance."""

    name = "prometheus"

    def __init__(self, client: PrometheusClient, *, clock: Callable[[], datetime] = utcnow) -> None:
        self.client = client
        self._clock = clock

    def collect(self) -> list[Signal]:
        signals = []
        for series in self.client.query("up"):
            labels = dict(series.get("metric") or {})
            ts, value = (series.get("value") or [None, None])[:2]
            instance = labels.get("instance", "")
            signals.append(
                Signal(
                    kind=SignalKind.METRIC,
                    source=f"prometheus:{self.client.url}",
                    subject=Subject(kind=SubjectKind.NODE, id=instance, name=instance.rsplit(":", 1)[0]),
                    observed_at=datetime.fromtimestamp(float(ts), tz=timezone.utc) if ts else self._clock(),
                    value=float(value) if value is not None else None,
                    attrs={keys.METRIC: "up", "job": labels.get("job"), keys.LABELS: labels},
                )
            )
        return signals
