"""Find the programs the local stack starts, or say how to install them."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from core.errors import MissingBinary

# sshd lives in /usr/sbin, which is often not on a normal user's PATH.
_EXTRA_DIRS = ("/usr/sbin", "/sbin", "/usr/local/sbin")


def require(name: str, apt_package: str, *, search_path: str | None = None) -> str:
    """The absolute path of program `name`, or MissingBinary naming the package to install.

    `search_path` replaces $PATH (tests use it to prove the error); the sbin folders are always searched.
    """
    path = search_path if search_path is not None else os.environ.get("PATH", "")
    dirs = [d for d in path.split(os.pathsep) if d]
    dirs += [d for d in _EXTRA_DIRS if d not in dirs]
    found = shutil.which(name, path=os.pathsep.join(dirs))
    if found is None:
        raise MissingBinary(name, hint=f"run `make test` or `apt-get install {apt_package}`")
    return str(Path(found).resolve()) if not os.path.isabs(found) else found


def require_ray() -> str:
    """The `ray` CLI of the running interpreter's environment first, so a venv's Ray is the one used."""
    beside = Path(sys.executable).parent / "ray"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("ray")
    if found is None:
        raise MissingBinary("ray", hint="run `make test` or `pip install 'ray[default]'` in the Argus venv")
    return found
