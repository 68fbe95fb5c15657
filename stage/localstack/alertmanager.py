"""A real Alertmanager that sends every alert to one webhook (in tests: a WebhookReceiver)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import yaml
from loguru import logger

from core.errors import SourceUnavailable
from stage.localstack.binaries import require
from stage.localstack.process import run_check
from stage.localstack.service import HttpService


class Alertmanager(HttpService):
    _label = "Alertmanager"

    def __init__(
        self,
        work_dir: Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        webhook_url: str,
        group_wait: str = "1s",
        group_interval: str = "1s",
        repeat_interval: str = "1h",
        alertmanager_bin: str | None = None,
    ) -> None:
        super().__init__(work_dir, host=host, port=port)
        self.webhook_url = webhook_url
        self.group_wait = group_wait
        self.group_interval = group_interval
        self.repeat_interval = repeat_interval
        self.alertmanager_bin = alertmanager_bin
        self.config_path = self.work_dir / "alertmanager.yml"

    def config(self) -> dict[str, Any]:
        return {
            "route": {
                "receiver": "webhook",
                "group_by": ["alertname"],
                "group_wait": self.group_wait,
                "group_interval": self.group_interval,
                "repeat_interval": self.repeat_interval,
            },
            "receivers": [
                {"name": "webhook", "webhook_configs": [{"url": self.webhook_url, "send_resolved": True}]}
            ],
        }

    def start(self, timeout: float = 60.0) -> Alertmanager:
        if self._running():
            return self
        binary = self.alertmanager_bin or require("prometheus-alertmanager", "prometheus-alertmanager")
        amtool = require("amtool", "prometheus-alertmanager")
        self._prepare()
        self.config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        run_check(
            [amtool, "check-config", str(self.config_path)],
            f"Alertmanager config {self.config_path}",
            "fix the webhook URL or intervals passed to Alertmanager(...)",
        )
        argv = [
            binary,
            f"--config.file={self.config_path}",
            f"--storage.path={self.work_dir / 'data'}",
            f"--web.listen-address={self.host}:{self._port}",
            "--cluster.listen-address=",  # empty: no gossip port to collide with other instances
            f"--web.external-url=http://{self.host}:{self._port}/",
        ]
        self._launch_http("alertmanager", argv, timeout)
        logger.info("Alertmanager up at {} sending to {}", self.url, self.webhook_url)
        return self

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts Alertmanager holds now (GET /api/v2/alerts)."""
        try:
            resp = httpx.get(f"{self.url}/api/v2/alerts", timeout=10)
            resp.raise_for_status()
        except httpx.HTTPError as exc:
            raise SourceUnavailable("Alertmanager", self.url, str(exc), hint="is it still running?") from None
        return resp.json()

    def log_paths(self) -> list[Path]:
        return [self.work_dir / "alertmanager.log", self.config_path]
