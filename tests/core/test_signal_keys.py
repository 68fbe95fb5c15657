"""core.signal_keys: collectors write and detectors read the same keys."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from core import signal_keys

ROOT = Path(__file__).resolve().parents[2]


def test_keys_are_distinct_strings() -> None:
    keys = {n: v for n, v in vars(signal_keys).items() if n.isupper() and not n.endswith("_METRIC")}
    assert keys and all(isinstance(v, str) for v in keys.values())
    assert len(set(keys.values())) == len(keys), "two constants spell one key"


def test_the_collector_and_detector_constants_are_the_core_ones() -> None:
    from collectors import placement, storage
    from detectors import disk_space, idle_gpu

    assert storage.METRIC == disk_space.METRIC == signal_keys.STORAGE_FREE_BYTES_METRIC
    assert placement.PLACEMENT_METRIC == idle_gpu.PLACEMENT_METRIC == signal_keys.PLACEMENT_METRIC
    assert placement.JOB_GPUS_METRIC == idle_gpu.JOB_GPUS_METRIC == signal_keys.JOB_GPUS_METRIC


@pytest.mark.parametrize("module", ["core/signal_keys.py", "core/refs.py", "core/jobfolder.py", "core/names.py"])
def test_core_imports_nothing_of_ours(module: str) -> None:
    tree = ast.parse((ROOT / module).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    ours = {"control", "collectors", "detectors", "rca", "remediation", "argus", "bench"}
    assert not imported & ours
