"""A real OpenSSH server on a loopback port with its own host key and one client key.

It runs in the foreground (`-D -e`, log to stderr, captured in sshd.log) as the current user, so tests
and the demo can reach "nodes" over real SSH with a pinned host key.
"""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
from pathlib import Path

from loguru import logger

from core.errors import ArgusError
from stage.localstack.binaries import require
from stage.localstack.process import run_check
from stage.localstack.service import LocalService


def _keygen(ssh_keygen: str, path: Path, comment: str) -> None:
    if path.exists():
        return
    done = subprocess.run(
        [ssh_keygen, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        raise ArgusError(
            f"ssh-keygen could not create {path}: {(done.stdout + done.stderr).strip()}",
            hint=f"check that {path.parent} is writable",
        )


class Sshd(LocalService):
    _label = "Sshd"
    _stop_grace = 5.0

    def __init__(self, work_dir: Path, *, host: str = "127.0.0.1", port: int = 0, sshd_bin: str | None = None):
        super().__init__(work_dir, host=host, port=port)
        self.sshd_bin = sshd_bin
        self.host_key = self.work_dir / "ssh_host_ed25519_key"
        self.client_key = self.work_dir / "id_ed25519"
        self.authorized_keys = self.work_dir / "authorized_keys"
        self.known_hosts = self.work_dir / "known_hosts"
        self.config_path = self.work_dir / "sshd_config"
        self.pid_file = self.work_dir / "sshd.pid"

    def __repr__(self) -> str:
        return f"Sshd({self.host}:{self._port or '?'})"

    @property
    def user(self) -> str:
        return pwd.getpwuid(os.getuid()).pw_name

    @property
    def host_public_key(self) -> str:
        """The host key as "ssh-ed25519 AAAA...", for pinning in known_hosts."""
        key_type, key = (self.host_key.with_suffix(".pub").read_text().split() + ["", ""])[:2]
        return f"{key_type} {key}"

    def known_hosts_line(self) -> str:
        return f"[{self.host}]:{self.port} {self.host_public_key}"

    def config(self) -> str:
        lines = [
            f"Port {self.port}",
            f"ListenAddress {self.host}",
            f"HostKey {self.host_key}",
            f"PidFile {self.pid_file}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            # The work dir is usually under a shared /tmp that StrictModes would reject.
            "StrictModes no",
            "PrintMotd no",
            "Subsystem sftp internal-sftp",
        ]
        return "\n".join(lines) + "\n"

    def start(self, timeout: float = 30.0) -> Sshd:
        if self._running():
            return self
        sshd = self.sshd_bin or require("sshd", "openssh-server")
        ssh_keygen = require("ssh-keygen", "openssh-client")
        self._prepare()
        _keygen(ssh_keygen, self.host_key, "argus-localstack-host")
        _keygen(ssh_keygen, self.client_key, "argus-localstack-client")
        self.authorized_keys.write_text(self.client_key.with_suffix(".pub").read_text())
        self.authorized_keys.chmod(0o600)
        self.known_hosts.write_text(self.known_hosts_line() + "\n")
        self.config_path.write_text(self.config())
        # sshd refuses to start without its privilege-separation folder, which Debian creates at boot only.
        try:
            Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        except PermissionError:
            if os.getuid() == 0:
                raise
        run_check([sshd, "-t", "-f", str(self.config_path)], f"sshd config {self.config_path}",
                  "fix the generated sshd_config or the sshd installation")
        argv = [sshd, "-D", "-e", "-f", str(self.config_path)]
        self._launch("sshd", argv, self.work_dir / "sshd.log", self._banner,
                     f"an SSH banner on {self.host}:{self.port}", timeout)
        logger.info("sshd up at {}:{} for user {}", self.host, self.port, self.user)
        return self

    def _banner(self) -> bool:
        with socket.create_connection((self.host, self.port), timeout=2) as sock:
            return sock.recv(256).startswith(b"SSH-")

    def log_paths(self) -> list[Path]:
        return [self.work_dir / "sshd.log", self.config_path]
