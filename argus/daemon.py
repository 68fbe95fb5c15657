"""The daemon loop: runs the pipeline on APScheduler at a fixed interval, one tick at a time, plus
housekeeping chores (job timeouts) on their own intervals."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler
from loguru import logger

from argus.pipeline import Pipeline


class Daemon:
    def __init__(self, pipeline: Pipeline, *, interval_s: float,
                 chores: dict[str, tuple[Callable[[], Any], float]] | None = None) -> None:
        """`chores`: name -> (function, interval in seconds), each run on its own, a failure logged."""
        self.pipeline = pipeline
        self.interval_s = interval_s
        self.chores = dict(chores or {})
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
        for name, (fn, every_s) in self.chores.items():
            self._scheduler.add_job(_chore, "interval", args=(name, fn), seconds=every_s, id=f"chore:{name}",
                                    max_instances=1, coalesce=True, misfire_grace_time=max(1, int(every_s)))
        self._scheduler.start()
        logger.info("loop started: every {:.1f}s{}", self.interval_s,
                    "".join(f"; {name} every {every:.0f}s" for name, (_, every) in self.chores.items()))

    def stop(self) -> None:
        if self._scheduler.running:
            self._scheduler.shutdown(wait=True)


def _chore(name: str, fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception as exc:  # Ray being down must not kill the scheduler thread
        logger.warning("{} failed: {}", name, exc)
