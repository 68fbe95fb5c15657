"""Where each log reader stopped, persisted across restarts of Argus.

A small JSON file per collector, rewritten atomically (write a temp file beside it, fsync, rename) once
per poll. Why JSON and not SQLite: the data is a few hundred to a few thousand small records written by
one process, read once at start; a JSON file needs no schema or migrations, can be read and fixed by an
operator with a text editor, and a rename is atomic on every local and NFS file system we target. It
stays out of the incident database so a slow or locked store never stalls log reading.

A file that cannot be read back (truncated by a crash of the disk, edited by hand) is moved aside as
`<name>.corrupt-<timestamp>` with a warning and reading starts afresh: from the beginning of every
file. Lines may then be read twice, which the incident store folds into the incidents they already
opened (same fingerprint); missing a fault would be worse.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loguru import logger

from core.errors import StoreError

_VERSION = 1


class OffsetStore:
    """Reader positions by key (a file path, or node + file name for Ray logs), saved as one JSON file."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.recovered_from: Path | None = None  # where a corrupt file was moved, if one was
        self._entries: dict[str, dict[str, Any]] = self._load()
        self._dirty = False

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise StoreError(
                f"cannot read log offsets file {self.path}: {exc}",
                hint="check the permissions of the data folder (ARGUS_DATA_DIR)",
            ) from exc
        try:
            data = json.loads(raw.decode("utf-8"))
            if not isinstance(data, dict) or data.get("version") != _VERSION or not isinstance(data.get("files"), dict):
                raise ValueError(f"expected {{'version': {_VERSION}, 'files': {{...}}}}")
            entries = {str(k): v for k, v in data["files"].items() if isinstance(v, dict)}
        except (UnicodeDecodeError, ValueError) as exc:
            aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
            try:
                os.replace(self.path, aside)
                self.recovered_from = aside
            except OSError:
                aside = self.path
            logger.warning(
                "log offsets file {} is unreadable ({}); moved it to {} and reading every log from its start; "
                "lines already seen may be read again (incidents fold repeats)",
                self.path, str(exc)[:200], aside,
            )
            return {}
        return entries

    def get(self, key: str) -> dict[str, Any] | None:
        entry = self._entries.get(key)
        return dict(entry) if entry is not None else None

    def set(self, key: str, entry: dict[str, Any]) -> None:
        if self._entries.get(key) != entry:
            self._entries[key] = dict(entry)
            self._dirty = True

    def discard(self, key: str) -> None:
        if self._entries.pop(key, None) is not None:
            self._dirty = True

    def keys(self) -> Iterator[str]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def save(self) -> None:
        """Write the offsets if they changed; atomic, so a crash leaves the old file or the new one."""
        if not self._dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = json.dumps({"version": _VERSION, "files": self._entries}, separators=(",", ":"), sort_keys=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise StoreError(
                f"cannot write log offsets file {self.path}: {exc}",
                hint="check free space and permissions of the data folder (ARGUS_DATA_DIR)",
            ) from exc
        self._dirty = False
