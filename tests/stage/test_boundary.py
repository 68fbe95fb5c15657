"""The application apart from its stage: nothing under argus/ (nor the packages it is built from) imports
`stage` except `argus demo`, lazily, and the `argus-gpu` wheel does not ship the stage."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ARGUS = REPO / "argus"
PRODUCT = ("argus", "core", "collectors", "detectors", "rca", "remediation", "control")  # what the wheel ships
STAGE_PACKAGES = ("stage", "argus.localstack", "argus.sim", "argus.demo")  # the stage, by its new and old names

# The one allowed import: the `demo` command's body in argus/cli.py.
ALLOWED = {("argus/cli.py", "demo")}

def _is_stage(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in STAGE_PACKAGES)


def stage_imports(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, enclosing function or None) of every import of the stage in `path`."""
    found: list[tuple[int, str, str | None]] = []

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, child.name)
                continue
            modules: list[str] = []
            if isinstance(child, ast.Import):
                modules = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                modules = [child.module]
            found.extend((child.lineno, m, function) for m in modules if _is_stage(m))
            visit(child, function)

    visit(ast.parse(path.read_text(), filename=str(path)), None)
    return found


def test_the_finder_sees_imports_at_any_depth(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import stage\n"
        "from stage.sim.dcgm_exporter import X\n"
        "import stagehand\n"
        "from . import stage\n"
        "def f():\n"
        "    if True:\n"
        "        import argus.localstack.ports\n"
    )
    assert stage_imports(sample) == [
        (1, "stage", None), (2, "stage.sim.dcgm_exporter", None), (7, "argus.localstack.ports", "f"),
    ]


def test_argus_imports_the_stage_only_in_the_demo_command():
    offenders = []
    for path in sorted(p for package in PRODUCT for p in (REPO / package).rglob("*.py")):
        relative = path.relative_to(REPO).as_posix()
        for line, module, function in stage_imports(path):
            if (relative, function) not in ALLOWED:
                offenders.append(f"{relative}:{line} imports {module}")
    assert not offenders, "the application must not import the stage (stage/): " + "; ".join(offenders)


def test_the_demo_command_imports_the_stage():
    # Keeps ALLOWED honest: if the demo stops importing the stage, the exception above should go too.
    assert [(m, f) for _, m, f in stage_imports(ARGUS / "cli.py")] == [("stage.demo", "demo")]


def test_the_argus_wheel_does_not_ship_the_stage():
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    shipped = list(config["packages"]) + list(config.get("package-data", {}))
    assert not [p for p in shipped if _is_stage(p)]
    stage = tomllib.loads((REPO / "stage" / "pyproject.toml").read_text())
    assert stage["tool"]["setuptools"]["package-dir"] == {"stage": "."}
    # Every package under stage/ is listed, so the stage's own distribution is whole.
    on_disk = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "stage").rglob("__init__.py")}
    assert set(stage["tool"]["setuptools"]["packages"]) == on_disk
