"""Evaluates metric rules' PromQL through Prometheus and emits one METRIC signal per series they return.

Each poll runs every rule's `expr` as an instant query. Per rule it emits one marker signal (attrs
`rule_evaluated`, value = number of series) so the detector knows the rule ran and that series absent
from it have cleared, then one signal per returned series, tagged with the rule's reason and carrying the
series' labels and value. The subject is the GPU when the series has a UUID label, else the node (its
Hostname, else its scrape instance), else the cluster.

A rule whose query Prometheus rejects is skipped and kept in `last_errors`; the other rules still run.
Prometheus being unreachable raises SourceUnavailable, so the pipeline marks the source down.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from typing import Any, Protocol

from loguru import logger

from collectors.dcgm import gpu_subject
from collectors.prometheus import PrometheusClient
from core import signal_keys
from core.errors import InputError
from core.types import Signal, SignalKind, Subject, SubjectKind, utcnow

# The attribute names detectors.metric_rules reads, spelt once in core.signal_keys.
RULE_ATTR = signal_keys.RULE
EVALUATED_ATTR = signal_keys.RULE_EVALUATED

CLUSTER = Subject(kind=SubjectKind.CLUSTER, id="cluster", name="cluster")
_UUID_LABELS = ("UUID", "uuid")
_HOSTNAME_LABELS = ("Hostname", "hostname")


class QueryRule(Protocol):
    """What the collector needs of a rule (detectors.metric_rules.MetricRule has it). Read-only properties,
    not plain attributes: a frozen dataclass such as MetricRule only satisfies a protocol it may not write."""

    @property
    def reason(self) -> str: ...

    @property
    def expr(self) -> str: ...


def subject_of(labels: Mapping[str, str]) -> Subject:
    """The GPU, node or cluster a series is about."""
    uuid = next((labels[k] for k in _UUID_LABELS if labels.get(k)), None)
    host = next((labels[k] for k in _HOSTNAME_LABELS if labels.get(k)), None)
    instance = labels.get("instance") or ""
    if uuid:
        gpu = labels.get("gpu", "")
        where = host or instance.rsplit(":", 1)[0] or "?"
        if gpu.isdigit():
            return gpu_subject(where, int(gpu), uuid)
        return Subject(kind=SubjectKind.GPU, id=uuid, name=f"{where}/{uuid}")
    if host:
        return Subject(kind=SubjectKind.NODE, id=host, name=host)
    if instance:
        return Subject(kind=SubjectKind.NODE, id=instance, name=instance.rsplit(":", 1)[0])
    return CLUSTER


class MetricRuleCollector:
    name = "metric_rules"

    def __init__(
        self,
        client: PrometheusClient,
        rules: Iterable[QueryRule],
        *,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.client = client
        self.rules = list(rules)
        self._clock = clock
        self.last_errors: dict[str, InputError] = {}

    @property
    def source(self) -> str:
        return f"prometheus:{self.client.url}"

    def collect(self) -> list[Signal]:
        signals: list[Signal] = []
        errors: dict[str, InputError] = {}
        for rule in self.rules:
            try:
                rows = self.client.query(rule.expr)
                series = [self._signal(rule, row) for row in _vector(rule, rows)]
            except InputError as exc:
                errors[rule.reason] = exc
                logger.warning("metric rule {} skipped: {}", rule.reason, exc)
                continue
            signals.append(
                Signal(
                    kind=SignalKind.METRIC,
                    source=self.source,
                    subject=CLUSTER,
                    observed_at=self._clock(),
                    value=float(len(series)),
                    attrs={RULE_ATTR: rule.reason, EVALUATED_ATTR: True, "expr": rule.expr},
                )
            )
            signals.extend(series)
        self.last_errors = errors
        return signals

    def _signal(self, rule: QueryRule, row: dict[str, Any]) -> Signal:
        labels = {str(k): str(v) for k, v in (row.get("metric") or {}).items()}
        ts, raw = row["value"][:2]
        return Signal(
            kind=SignalKind.METRIC,
            source=self.source,
            subject=subject_of(labels),
            observed_at=datetime.fromtimestamp(float(ts), tz=timezone.utc),
            value=float(raw),
            attrs={RULE_ATTR: rule.reason, "metric": labels.get("__name__"), "labels": labels},
        )


def _vector(rule: QueryRule, rows: Any) -> list[dict[str, Any]]:
    """The instant vector a rule must return; a scalar or malformed answer is the rule's mistake."""
    if not isinstance(rows, list) or not all(
        isinstance(r, dict) and isinstance(r.get("value"), list) and len(r["value"]) >= 2 for r in rows
    ):
        raise InputError(
            f"metric rule {rule.reason}: its query returned {str(rows)[:200]!r}, not an instant vector",
            hint="a rule's expr must select series (e.g. `metric > 0`), not compute a scalar",
        )
    return rows
