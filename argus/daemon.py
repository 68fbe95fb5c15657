"""The daemon loop: runs the pipeline on APScheduler at a fixed interval, one tick at a time."""

from __future__ import annotations

from datetime import datetime, timezone

from apscheduler.schedulers.background import BackgroundScheduler
from loguru import logger

from argus.pipeline import Pipeline


class Daemon:
    def __init__(self, pipeline: Pipeline, *, interval_s: float) -> None:
        self.pipeline = pipeline
        self.interval_s = interval_s
        self._scheduler = BackgroundScheduler(timezone="UTC")

    def _tick(self) -> None:
        try:
            self.pipeline.run_once()
        except Exception as exc:  # the store being down must not kill the scheduler thread
            logger.opt(exception=exc).error("pipeline tick failed")

    def start(self, *, run_now: bool = True) -> None:
        first_run = {"next_run_time": datetime.now(timezone.utc)} if run_now else {}
        self._scheduler.add_job(
            self._tick,
            "interval",
            seconds=self.interval_s,
            id="pipeline",
            max_instances=1,  # a slow tick is skipped over, never run twice at once
            coalesce=True,
            misfire_grace_time=max(1, int(self.interval_s)),
            **first_run,
        )
        self._scheduler.start()
        logger.info("loop started: every {:.1f}s", self.interval_s)

    def stop(self) -> None:
        if self._scheduler.running:
            self._scheduler.shutdown(wait=True)
