"""Logging setup, called only by entry points (CLI, daemon, demo). Libraries just `from loguru import logger`.

Stdlib logging from Ray, uvicorn, APScheduler and alembic is routed into loguru so one format and one
level apply everywhere.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from loguru import logger

if TYPE_CHECKING:
    from loguru import Record

_ROUTED = ("ray", "uvicorn", "uvicorn.error", "uvicorn.access", "apscheduler", "alembic", "asyncssh", "httpx")
FORMAT = (
    "<green>{time:YYYY-MM-DD HH:mm:ss.SSS}</green> <level>{level: <7}</level> "
    "<cyan>{name}</cyan> {message}{extra[extra_str]}"
)


class _InterceptHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            level: str | int = logger.level(record.levelname).name
        except ValueError:
            level = record.levelno

        # show the library's logger name (e.g. uvicorn.error), not the frame loguru would guess
        def library_name(r: Record) -> None:
            r["name"] = record.name

        logger.patch(library_name).opt(exception=record.exc_info).log(level, record.getMessage())


def _extra_str(record: Record) -> bool:
    extra = {k: v for k, v in record["extra"].items() if k != "extra_str"}
    record["extra"]["extra_str"] = (" " + " ".join(f"{k}={v}" for k, v in extra.items())) if extra else ""
    return True


def setup_logging(level: str = "INFO", log_file: Path | None = None, quiet_libraries: bool = True) -> None:
    """Configure loguru for the process. Idempotent: a second call replaces the first."""
    logger.remove()
    logger.add(sys.stderr, level=level, format=FORMAT, filter=_extra_str, colorize=None)
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        logger.add(log_file, level="DEBUG", format=FORMAT, filter=_extra_str, rotation="50 MB", retention=5)
    handler = _InterceptHandler()
    # The root level decides for every library not named above (httpcore, urllib3, sqlalchemy...): at 0 each of
    # their debug calls is built and routed into loguru only to be dropped there, which cost a tenth of the server's
    # CPU in an alert storm (httpcore traces every request the webhook notifier makes).
    logging.basicConfig(handlers=[handler], level=logging.WARNING if quiet_libraries else 0, force=True)
    for name in _ROUTED:
        lib = logging.getLogger(name)
        lib.handlers = [handler]
        lib.propagate = False
        lib.setLevel(logging.WARNING if quiet_libraries and name != "alembic" else logging.INFO)
