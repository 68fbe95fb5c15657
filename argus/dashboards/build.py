"""Building dashboards/*.dashboard.py to Grafana JSON.

Every *.dashboard.py defines `dashboard` (grafanalib's convention); it is written as <name>.json beside it,
with sorted keys so that a rebuild is byte-identical.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import ConfigError

SUFFIX = ".dashboard.py"
DEFAULT_DIR = Path("dashboards")


class DashboardError(ConfigError):
    """A dashboard file cannot be loaded or rendered."""


@dataclass(frozen=True)
class Built:
    """One dashboard file rendered to Grafana JSON."""

    source: Path
    json_path: Path
    text: str

    @property
    def name(self) -> str:
        return self.source.name

    def data(self) -> dict[str, Any]:
        return json.loads(self.text)

    def is_fresh(self) -> bool:
        return self.json_path.is_file() and self.json_path.read_text(encoding="utf-8") == self.text


def dashboard_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise DashboardError(f"dashboards folder {folder} does not exist",
                             hint="run from the repository root or pass --dir")
    files = sorted(folder.glob("*" + SUFFIX))
    if not files:
        raise DashboardError(f"no *{SUFFIX} files in {folder}",
                             hint="add one that defines `dashboard = Dashboard(...)`")
    return files


def json_path_for(source: Path) -> Path:
    return source.with_name(source.name[: -len(SUFFIX)] + ".json")


def load_dashboard(source: Path) -> Any:
    """Run a *.dashboard.py file and return its `dashboard`; its folder is importable while it runs."""
    from grafanalib.core import Dashboard

    folder = source.parent.resolve()
    before = set(sys.modules)
    sys.path.insert(0, str(folder))
    try:
        spec = importlib.util.spec_from_file_location(f"_argus_dashboard_{source.name[: -len(SUFFIX)]}", source)
        if spec is None or spec.loader is None:
            raise DashboardError(f"dashboard {source} cannot be imported", hint=f"name it <name>{SUFFIX}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses and pickling look a class's module up here
        try:
            spec.loader.exec_module(module)
        except Exception as exc:  # the file is code: whatever it raises is the file's fault
            raise DashboardError(
                f"dashboard {source} failed to load: {type(exc).__name__}: {exc}",
                hint=f"run `python {source}` from its folder to see the traceback",
            ) from exc
    finally:
        if str(folder) in sys.path:
            sys.path.remove(str(folder))
        # Helpers imported from the folder (argus_panels) are forgotten, so another folder gets its own.
        for name in set(sys.modules) - before:
            origin = getattr(sys.modules[name], "__file__", None)
            if origin and Path(origin).resolve().parent == folder:
                del sys.modules[name]
    dashboard = getattr(module, "dashboard", None)
    if dashboard is None:
        raise DashboardError(f"dashboard {source} defines no `dashboard`",
                             hint="end the file with `dashboard = Dashboard(...)`")
    if not isinstance(dashboard, Dashboard):
        raise DashboardError(f"`dashboard` in {source} is a {type(dashboard).__name__}, not a grafanalib Dashboard",
                             hint="assign a grafanalib.core.Dashboard to `dashboard`")
    return dashboard


def render(dashboard: Any, source: Path) -> str:
    """Grafana JSON as grafanalib's generate-dashboard writes it (sorted keys, indent 2), panel ids filled in."""
    from grafanalib._gen import DashboardEncoder

    try:
        data = dashboard.auto_panel_ids().to_json_data()
        return json.dumps(data, sort_keys=True, indent=2, cls=DashboardEncoder) + "\n"
    except (TypeError, ValueError) as exc:
        raise DashboardError(f"dashboard {source} cannot be written as JSON: {exc}",
                             hint="use grafanalib objects, dicts, lists, strings and numbers only") from exc


def build_one(source: Path) -> Built:
    return Built(source, json_path_for(source), render(load_dashboard(source), source))


@dataclass(frozen=True)
class Problem:
    dashboard: str
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.dashboard}: {self.where}: {self.message}"


def build_all(folder: Path) -> tuple[list[Built], list[Problem]]:
    """Render every dashboard in `folder`; one that fails to load is a problem, the others still build."""
    built: list[Built] = []
    problems: list[Problem] = []
    for source in dashboard_files(folder):
        try:
            built.append(build_one(source))
        except DashboardError as exc:
            problems.append(Problem(source.name, "file", f"{exc.message} ({exc.hint})" if exc.hint else exc.message))
    return built, problems
