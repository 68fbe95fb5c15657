"""Ray's metric names from a real scrape, for dashboards/known_metrics/ray.txt (`argus dashboards ray-metrics`):
of the targets named, or of every target in Ray's service-discovery file once all nodes report.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from core.errors import ArgusError, ConfigError, SourceUnavailable

_SAMPLE_NAME = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)")
_RAY_VERSION_LABEL = re.compile(r'[{,]Version="([^"]+)"')


def parse_exposition(text: str) -> tuple[set[str], set[str]]:
    """Sample names in a Prometheus text exposition, and the Ray versions its `Version` labels name."""
    names: set[str] = set()
    versions: set[str] = set()
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if m := _SAMPLE_NAME.match(line):
            names.add(m.group(1))
        versions.update(_RAY_VERSION_LABEL.findall(line))
    return names, versions


def scrape(target: str, *, timeout: float = 10.0) -> str:
    """GET http://<target>/metrics (target: host:port, or a full URL)."""
    import httpx

    url = target if "://" in target else f"http://{target}/metrics"
    try:
        resp = httpx.get(url, timeout=timeout)
    except httpx.HTTPError as exc:
        raise SourceUnavailable("metrics endpoint", url, str(exc) or type(exc).__name__,
                                hint="is the Ray node up, and is this its metrics export port?") from None
    if resp.status_code != 200:
        raise SourceUnavailable("metrics endpoint", url, f"HTTP {resp.status_code}", hint="check the address")
    return resp.text


def sd_targets(sd_file: Path) -> list[str]:
    """The targets of a Prometheus file_sd file (Ray's prom_metrics_service_discovery.json)."""
    try:
        groups = json.loads(sd_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"service-discovery file {sd_file} cannot be read: {exc}",
                          hint="point --sd-file at Ray's <temp dir>/prom_metrics_service_discovery.json") from None
    if not isinstance(groups, list):
        raise ConfigError(f"service-discovery file {sd_file} is not a list of target groups",
                          hint="point --sd-file at Ray's prom_metrics_service_discovery.json")
    targets = [t for g in groups if isinstance(g, dict) and isinstance(g.get("targets"), list)
               for t in g["targets"] if isinstance(t, str)]
    return list(dict.fromkeys(targets))


def scrape_ray_names(targets: Sequence[str]) -> tuple[set[str], set[str]]:
    names: set[str] = set()
    versions: set[str] = set()
    for target in targets:
        found, seen_versions = parse_exposition(scrape(target))
        names |= found
        versions |= seen_versions
    return names, versions


def wait_for_ray_names(sd_file: Path, nodes: int, *, timeout: float = 180.0, settle_rounds: int = 3,
                       pause_s: float = 2.0) -> tuple[set[str], set[str]]:
    """Scrape every target Ray lists until all `nodes` node agents report node metrics, then a few rounds
    more (some metrics appear only after the first reports); return the union of names and versions."""
    deadline = time.monotonic() + timeout
    last_error = "no scrape yet"
    names: set[str] = set()
    versions: set[str] = set()
    settled = 0
    while True:
        try:
            targets = sd_targets(sd_file) if sd_file.exists() else []
            reporting = 0
            for target in targets:
                found, seen = parse_exposition(scrape(target))
                names |= found
                versions |= seen
                reporting += "ray_node_cpu_utilization" in found
            if reporting >= nodes:
                settled += 1
                if settled > settle_rounds:
                    return names, versions
            last_error = f"{reporting} of {nodes} node agents report node metrics"
        except ArgusError as exc:
            last_error = exc.message
        if time.monotonic() >= deadline:
            raise SourceUnavailable("Ray's metrics", str(sd_file), f"not ready within {timeout:.0f} s: {last_error}",
                                    hint="see the Ray logs; a busy machine may need a longer --timeout")
        time.sleep(pause_s)


def ray_metrics_text(names: Iterable[str], versions: Iterable[str], origin: str) -> str:
    version = ", ".join(sorted(versions)) or "unknown"
    header = [
        "# Metric names Ray serves to Prometheus, one a line: every node's metrics agent, the dashboard and the",
        "# autoscaler. Metrics Ray creates only once there is work (tasks, actors, jobs) may be missing.",
        f"# Scraped from {origin} by `argus dashboards ray-metrics`; regenerate after upgrading Ray.",
        f"# Ray version: {version}",
    ]
    return "\n".join(header + sorted(names)) + "\n"
