"""Free TCP ports for local services.

Several test runs share this machine, so nothing here uses a fixed port. A port is free when the
kernel lets us bind it on every interface: Ray's GCS and metrics exporter bind 0.0.0.0, so checking one
loopback address alone would hand out ports another cluster already holds on a different address.
Ports handed out by this process are remembered so two services started side by side never get the
same one before either has bound it.
"""

from __future__ import annotations

import random
import socket
import threading

from core.errors import ArgusError

_lock = threading.Lock()
_handed_out: set[int] = set()
_MAX_PORT = 60999


def is_free(port: int, host: str = "") -> bool:
    """True when `port` can be bound on `host` ("" means every interface) right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(*, min_port: int = 1024, attempts: int = 200) -> int:
    """A TCP port no process holds on any interface, at least `min_port`, not handed out before.

    The kernel's own choice (bind to port 0) is tried first because it avoids ports in TIME_WAIT; a
    random scan covers the case where the ephemeral range lies below `min_port`.
    """
    with _lock:
        for i in range(attempts):
            if i < attempts // 2:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                    sock.bind(("", 0))
                    port = sock.getsockname()[1]
            else:
                port = random.randint(max(min_port, 1024), _MAX_PORT)
            if port < min_port or port in _handed_out or not is_free(port):
                continue
            _handed_out.add(port)
            return port
    raise ArgusError(
        f"no free TCP port >= {min_port} found after {attempts} attempts",
        hint="the machine is running out of ports; stop leftover test services (see `ss -ltnp`)",
    )


def free_ports(count: int, *, min_port: int = 1024) -> list[int]:
    return [free_port(min_port=min_port) for _ in range(count)]
