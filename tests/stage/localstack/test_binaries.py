"""Finding installed programs, and the error that says how to install a missing one."""

from __future__ import annotations

import pytest

from core.errors import MissingBinary
from stage.localstack.binaries import require
from stage.localstack.prometheus import Prometheus
from stage.localstack.sshd import Sshd


def test_missing_binary_names_it_and_the_package():
    with pytest.raises(MissingBinary) as info:
        require("argus-no-such-program", "argus-no-such-package")
    assert info.value.binary == "argus-no-such-program"
    assert info.value.hint == "run `make test` or `apt-get install argus-no-such-package`"
    assert "argus-no-such-program" in str(info.value)


def test_sshd_is_found_in_sbin_even_off_path():
    assert require("sshd", "openssh-server", search_path="").endswith("/sshd")


def test_prometheus_without_the_binary_on_path_fails_before_starting(tmp_workdir, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_workdir))
    with pytest.raises(MissingBinary, match="prometheus") as info:
        Prometheus(tmp_workdir / "prom").start()
    assert "apt-get install prometheus" in (info.value.hint or "")


def test_sshd_start_without_ssh_keygen_names_openssh_client(tmp_workdir, monkeypatch):
    # sshd itself is still found in /usr/sbin; ssh-keygen lives in /usr/bin, which is now off PATH.
    monkeypatch.setenv("PATH", str(tmp_workdir))
    server = Sshd(tmp_workdir / "sshd")
    with pytest.raises(MissingBinary, match="ssh-keygen") as info:
        server.start()
    assert "openssh-client" in (info.value.hint or "")
    server.stop()
