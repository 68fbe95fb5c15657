"""What a deployment installs and runs (deploy/): the wheel `pip install` builds holds every package and data file
the application needs and imports without the source tree; the systemd unit passes `systemd-analyze verify` and its
commands are argus commands with options argus takes; the example settings file loads. The Dockerfile's build stage
is this same wheel build (no Docker daemon here to run it)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from core.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
APP = ("core", "collectors", "detectors", "rca", "remediation", "control", "argus")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # From a clean copy of what the Dockerfile copies: setuptools reuses a build/ folder, which could hide a package
    # the packaging no longer finds.
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for top in APP:
        shutil.copytree(ROOT / top, source / top, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(out), str(source)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    [path] = out.glob("argus_gpu-*.whl")
    return path


def test_the_wheel_holds_every_package_and_data_file(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = sorted(str(p.parent.relative_to(ROOT)) for top in APP for p in (ROOT / top).rglob("__init__.py")
                      if "__pycache__" not in p.parts)
    missing = [p for p in packages if f"{p}/__init__.py" not in names]
    assert missing == []
    data = [p for top in APP for pattern in ("*.yaml", "*.jinja2", "*.html", "*.css", "*.js", "*.mako")
            for p in (ROOT / top).rglob(pattern)]
    assert len(data) > 20
    assert [str(p.relative_to(ROOT)) for p in data if str(p.relative_to(ROOT)) not in names] == []
    assert not any(n.startswith(("tests/", "stage/", "bench/")) for n in names)


def test_the_installed_wheel_runs_without_the_source_tree(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                                str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr
    # The wheel's packages first; the venv's site-packages for the dependencies; never the checkout.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARGUS_") and k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    program = ("import importlib, pkgutil, sys\n"
               f"sys.path = [p for p in sys.path if not p.startswith({str(ROOT)!r}) or 'site-packages' in p]\n"
               f"for top in {APP!r}:\n"
               "    module = importlib.import_module(top)\n"
               f"    assert module.__file__.startswith({str(target)!r}), module.__file__\n"
               "    for info in pkgutil.walk_packages(module.__path__, top + '.'):\n"
               "        if '.migrations.' not in info.name:\n"
               "            importlib.import_module(info.name)\n"
               "from argus.cli import main\n"
               "sys.argv = ['argus', 'doctor', '--help']\n"
               "main()\n")
    ran = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "Check the database" in ran.stdout


def test_the_systemd_unit_verifies_and_runs_argus_commands(tmp_path: Path) -> None:
    argus = shutil.which("argus", path=str(Path(sys.executable).parent))
    assert argus is not None
    unit = (DEPLOY / "argus.service").read_text()
    commands = [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith(("ExecStart=", "ExecStartPre="))]
    assert len(commands) == 2 and all(c.startswith("/opt/argus/bin/argus ") for c in commands)
    for command in commands:  # each with the options it names: argus would refuse an option it does not take
        argv = [argus, *shlex.split(command)[1:], "--help"]
        assert subprocess.run(argv, capture_output=True, text=True, timeout=120).returncode == 0, command
    verify = shutil.which("systemd-analyze")
    if verify is None:
        pytest.skip("systemd-analyze is not installed here")
    local = tmp_path / "argus.service"
    local.write_text(unit.replace("/opt/argus/bin/argus", argus))
    checked = subprocess.run([verify, "verify", str(local)], capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0 and checked.stderr.strip() == "", checked.stderr


def test_the_example_settings_load(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("ARGUS_"):
            monkeypatch.delenv(key)
    settings = load_settings(DEPLOY / "argus.yaml")
    assert settings.leader_election and settings.node_agents and settings.remediation_mode == "approval"
    assert str(settings.shared_root) in (DEPLOY / "argus.service").read_text()  # the unit may write there


def test_the_dockerfile_builds_the_same_wheel_and_runs_serve() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    copied = {name for line in text.splitlines() if line.startswith("COPY ") and "--from" not in line
              for name in line.split()[1:-1]}
    assert set(APP) <= copied and {"pyproject.toml", "README.md"} <= copied
    assert "pip wheel --no-cache-dir --no-deps -w /wheels ." in text and "argus serve --host 0.0.0.0" in text
    assert "USER argus" in text and "HEALTHCHECK" in text
