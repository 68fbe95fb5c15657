"""Which metrics a dashboard may name: Ray's (dashboards/known_metrics/ray.txt, from a real scrape),
dcgm-exporter's default counters (collectors/dcgm_fields.py), Argus's own (whatever
`ArgusMetrics().registry` exports) and Prometheus's `up`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collectors.dcgm_fields import DEFAULT_COUNTERS
from core.errors import ConfigError

RAY_METRICS_FILE = Path("known_metrics") / "ray.txt"  # inside the dashboards folder
PROMETHEUS_OWN = frozenset({"up"})
_METRIC_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*\Z")


@dataclass(frozen=True)
class KnownMetrics:
    """Metric names by where they come from (Ray, dcgm-exporter, Argus, Prometheus)."""

    sources: Mapping[str, frozenset[str]]

    def source_of(self, name: str) -> str | None:
        return next((source for source, names in self.sources.items() if name in names), None)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.source_of(name) is not None


def dcgm_metric_names() -> frozenset[str]:
    return frozenset(field.name for field in DEFAULT_COUNTERS)


def read_metric_list(path: Path) -> frozenset[str]:
    """Names from a known-metrics file: one a line, '#' starts a comment line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ConfigError(f"known-metrics file {path} does not exist",
                          hint="write it with `argus dashboards ray-metrics`") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"known-metrics file {path} cannot be read: {exc}",
                          hint="write it again with `argus dashboards ray-metrics`") from None
    names = set()
    for number, line in enumerate(lines, start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not _METRIC_NAME.match(line):
            raise ConfigError(f"{path}:{number}: {line[:80]!r} is not a metric name",
                              hint="one name a line; regenerate it with `argus dashboards ray-metrics`")
        names.add(line)
    if not names:
        raise ConfigError(f"known-metrics file {path} lists no metric",
                          hint="regenerate it with `argus dashboards ray-metrics`")
    return frozenset(names)


def recorded_ray_version(path: Path) -> str | None:
    """The Ray version a known-metrics file says it was scraped from (its '# Ray version: x' line)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if m := re.match(r"#\s*Ray version:\s*(\S+)", line):
            return m.group(1)
    return None


def known_metrics(folder: Path, *, argus_registry: Any = None) -> KnownMetrics:
    """Ray's from the folder's known_metrics/ray.txt, dcgm-exporter's, Argus's (`argus_registry`, by default
    a fresh ArgusMetrics's: whatever Argus exports now) and Prometheus's."""
    from argus.exporter import ArgusMetrics, exported_series_names

    registry = argus_registry if argus_registry is not None else ArgusMetrics().registry
    return KnownMetrics({
        "Ray": read_metric_list(folder / RAY_METRICS_FILE),
        "dcgm-exporter": dcgm_metric_names(),
        "Argus": frozenset(exported_series_names(registry)),
        "Prometheus": PROMETHEUS_OWN,
    })
