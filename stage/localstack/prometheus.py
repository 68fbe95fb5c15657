"""A real Prometheus process scraping a local Ray cluster and static targets, evaluating rule files.

Targets and rules can be added while it runs, so one Prometheus serves a whole test session:
`set_targets` writes a file_sd file (re-read within seconds), `add_rule_file` copies a rule file into the
watched folder and reloads.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml
from loguru import logger

from core.errors import ConfigError, SourceUnavailable
from stage.localstack.binaries import require
from stage.localstack.process import StackTimeout, run_check
from stage.localstack.service import HttpService

# Ray rewrites its SD file through a symlink, which file watchers miss; re-read it on this interval.
_SD_REFRESH = "2s"


class Prometheus(HttpService):
    _label = "Prometheus"

    def __init__(
        self,
        work_dir: Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        scrape_interval: str = "1s",
        ray_sd_file: Path | None = None,
        static_targets: Mapping[str, Sequence[str]] | None = None,
        rule_files: Sequence[Path] = (),
        alertmanager_url: str | None = None,
        evaluation_interval: str = "1s",
        alert_resend_delay: str = "1s",
        prometheus_bin: str | None = None,
    ) -> None:
        super().__init__(work_dir, host=host, port=port)
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval
        self.alert_resend_delay = alert_resend_delay
        self.ray_sd_file = ray_sd_file
        self.static_targets = {job: list(t) for job, t in (static_targets or {}).items()}
        self.rule_files = [Path(p) for p in rule_files]
        self.alertmanager_url = alertmanager_url
        self.prometheus_bin = prometheus_bin
        self.config_path = self.work_dir / "prometheus.yml"
        self.targets_dir = self.work_dir / "targets"
        self.rules_dir = self.work_dir / "rules"

    def config(self) -> dict[str, Any]:
        scrape: list[dict[str, Any]] = []
        if self.ray_sd_file is not None:
            scrape.append(
                {
                    "job_name": "ray",
                    "file_sd_configs": [{"files": [str(self.ray_sd_file)], "refresh_interval": _SD_REFRESH}],
                }
            )
        for job, targets in self.static_targets.items():
            scrape.append({"job_name": job, "static_configs": [{"targets": targets}]})
        # Targets added at run time; each file's group sets its own `job` label.
        scrape.append(
            {
                "job_name": "file-targets",
                "file_sd_configs": [{"files": [str(self.targets_dir / "*.json")], "refresh_interval": _SD_REFRESH}],
            }
        )
        cfg: dict[str, Any] = {
            "global": {
                "scrape_interval": self.scrape_interval,
                "scrape_timeout": self.scrape_interval,
                "evaluation_interval": self.evaluation_interval,
            },
            "rule_files": [str(p) for p in self.rule_files] + [str(self.rules_dir / "*.yml")],
            "scrape_configs": scrape,
        }
        if self.alertmanager_url:
            am = urlsplit(self.alertmanager_url)
            entry: dict[str, Any] = {"scheme": am.scheme or "http", "static_configs": [{"targets": [am.netloc]}]}
            if am.path.strip("/"):
                entry["path_prefix"] = am.path
            cfg["alerting"] = {"alertmanagers": [entry]}
        return cfg

    def start(self, timeout: float = 60.0) -> Prometheus:
        if self._running():
            return self
        binary = self.prometheus_bin or require("prometheus", "prometheus")
        promtool = require("promtool", "prometheus")
        self._prepare()
        self.targets_dir.mkdir(exist_ok=True)
        self.rules_dir.mkdir(exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        run_check(
            [promtool, "check", "config", str(self.config_path)],
            f"Prometheus config {self.config_path}",
            "fix the rule files or targets passed to Prometheus(...)",
        )
        argv = [
            binary,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.work_dir / 'data'}",
            f"--web.listen-address={self.host}:{self._port}",
            "--web.enable-lifecycle",
            # A firing alert sent while the notifier is still finding Alertmanager (just after start or a
            # reload) is dropped, and the default resend delay of 1m would hold it back that long.
            f"--rules.alert.resend-delay={self.alert_resend_delay}",
            f"--web.external-url=http://{self.host}:{self._port}/",
        ]
        self._launch_http("prometheus", argv, timeout)
        logger.info("Prometheus up at {}", self.url)
        return self

    def reload(self) -> None:
        """Re-read the config and rule files (POST /-/reload)."""
        try:
            resp = httpx.post(f"{self.url}/-/reload", timeout=10)
        except httpx.HTTPError as exc:
            raise SourceUnavailable("Prometheus", self.url, str(exc), hint="is it still running?") from None
        if resp.status_code != 200:
            raise ConfigError(f"Prometheus at {self.url} refused to reload: {resp.text.strip()}",
                              hint=f"see {self.work_dir / 'prometheus.log'}")

    def add_rule_file(self, path: Path) -> Path:
        """Check a rule file with promtool, copy it into the watched rules folder and reload."""
        promtool = require("promtool", "prometheus")
        run_check([promtool, "check", "rules", str(path)], f"rule file {path}", "fix the rule file")
        dest = self.rules_dir / (Path(path).stem + ".yml")
        shutil.copyfile(path, dest)
        self.reload()
        return dest

    def set_targets(self, job: str, targets: Sequence[str], labels: Mapping[str, str] | None = None) -> Path:
        """Scrape `targets` ("host:port") as job `job` from now on; an empty list removes the job."""
        path = self.targets_dir / f"{job}.json"
        if not targets:
            path.unlink(missing_ok=True)
            return path
        group = [{"targets": list(targets), "labels": {**(labels or {}), "job": job}}]
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(group))
        tmp.replace(path)  # atomic, so Prometheus never reads half a file
        return path

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant-query result list (`data.result`) for `promql`."""
        try:
            resp = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        except httpx.HTTPError as exc:
            raise SourceUnavailable("Prometheus", self.url, str(exc), hint="is it still running?") from None
        body = resp.json()
        if body.get("status") != "success":
            raise ConfigError(f"Prometheus rejected query {promql!r}: {body.get('error')}", hint="fix the PromQL")
        return body["data"]["result"]

    def wait_for_series(self, query: str, timeout: float = 60.0, min_series: int = 1) -> list[dict[str, Any]]:
        """Poll `query` until it returns at least `min_series` series; return them."""
        deadline = time.monotonic() + timeout
        result: list[dict[str, Any]] = []
        while True:
            result = self.query(query)
            if len(result) >= min_series:
                return result
            if time.monotonic() >= deadline:
                raise StackTimeout(
                    f"Prometheus at {self.url} returned {len(result)} series for {query!r} within "
                    f"{timeout:.0f} s, wanted {min_series}",
                    hint=f"check {self.url}/targets for scrape errors",
                )
            time.sleep(0.5)

    def log_paths(self) -> list[Path]:
        return [self.work_dir / "prometheus.log", self.config_path, self.rules_dir, self.targets_dir]
