"""A SIMULATOR of NVIDIA dcgm-exporter, for tests and demos on machines without GPUs.

Nothing served here is GPU data: every value comes from the simulated state below, which tests and
demos set in process (`set_gpu`, `set_all`) or over HTTP (`POST /sim/gpus[/<index>]`). What is real is
the *format*: `/metrics` is written the way dcgm-exporter writes it (releases 3.3.7-3.5.0 through
4.5.3-4.8.2, checked against NVIDIA/dcgm-exporter's source and a real H100 node's output), so the
parsers, dashboards and alert rules that read it are exercised as they will be in production:

- the counters of dcgm-exporter's `etc/default-counters.csv`, in that file's order, with its HELP texts
  and Prometheus types; DCGM_FI_DRIVER_VERSION as a label, as the real exporter does it;
- one line per GPU, labels in the exporter's order: gpu, UUID, pci_bus_id, device, modelName,
  Hostname, then DCGM_FI_DRIVER_VERSION, then the per-line attributes sorted by name;
- integer fields printed as integers, floating-point fields with six decimals (Go's `%f`);
- DCGM_FI_DEV_XID_ERRORS carries `err_code` and `err_msg` attributes; when HPC jobs are attached to a
  GPU (dcgm-exporter's `--hpc-job-mapping-dir`, a Kubernetes-less job mapping), each line of that GPU
  is repeated once per job with an `hpc_job` attribute.

Known differences from the real exporter: values change the moment they are set (the real one
refreshes every collect interval, 30 s by default); Xids outside the short table below print
err_msg="Unknown Error"; no MIG, NVLink-, NvSwitch- or CPU-level series.

One module on purpose: the simulated GPU state, the counter table that reads it, the renderer and the
HTTP server that sets and serves it are one format checked against one upstream exporter; split, a
change to a field would have to be made in step across files that mean nothing alone.
"""

from __future__ import annotations

import json
import random
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from loguru import logger
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from collectors import dcgm_fields
from core.errors import ConfigError, InputError, NotFound

DEFAULT_MODEL_NAME = "NVIDIA H100 80GB HBM3"
DEFAULT_FB_TOTAL_MIB = 81559  # what an H100 80GB HBM3 reports as total framebuffer
DEFAULT_DRIVER_VERSION = "535.129.03"
MAX_BODY_BYTES = 64 * 1024
MAX_GPUS = 16
METRICS_CONTENT_TYPE = "text/plain; charset=utf-8"  # what Go sniffs for the exporter's text

# dcgm-exporter writes "Hostname" in every release so far; its main branch renamed it "hostname" in 2026.
HOSTNAME_LABELS = ("Hostname", "hostname")

# Bus ids as on an 8-GPU HGX H100 board, so demo dashboards look like a real node.
_HGX_BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")

# err_msg texts for the Xids Argus reasons about (from NVIDIA's Xid catalog, as dcgm-exporter prints them).
XID_MESSAGES: dict[int, str] = {
    0: "No Error",
    8: "GPU stopped processing",
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    32: "Invalid or corrupted push buffer stream",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda",
    48: "Double Bit ECC Error",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    69: "Graphics Engine class error",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context Switch Timeout Error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
    121: "C2C Link Error",
    140: "Unrecovered ECC Error",
    143: "GPU Initialization Failure",
}
UNKNOWN_XID_MESSAGE = "Unknown Error"

_SAFE_LABEL_VALUE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._:/@+-]{0,127}\Z")


@dataclass
class SimGpu:
    """The simulated state of one GPU. Counters (energy, NVLink, PCIe replays, remapped rows) only grow."""

    index: int
    uuid: str
    pci_bus_id: str
    model_name: str = DEFAULT_MODEL_NAME
    fb_total_mib: int = DEFAULT_FB_TOTAL_MIB
    fb_reserved_mib: int = 0
    util: int = 0
    mem_copy_util: int = 0
    enc_util: int = 0
    dec_util: int = 0
    fb_used_mib: int = 0
    temp_c: int = 32
    memory_temp_c: int = 30
    power_w: float = 70.0
    sm_clock_mhz: int = 345
    mem_clock_mhz: int = 2619
    xid: int = 0  # the last Xid seen; 0 = none
    gr_engine_active: float = 0.0
    tensor_active: float = 0.0
    dram_active: float = 0.0
    pcie_tx_bytes_per_s: int = 0
    pcie_rx_bytes_per_s: int = 0
    nvlink_bytes_per_s: int = 0
    pcie_replays: int = 0
    correctable_remapped_rows: int = 0
    uncorrectable_remapped_rows: int = 0
    row_remap_failure: int = 0
    vgpu_license_status: int = 0
    hpc_jobs: list[str] = field(default_factory=list)
    energy_mj: float = 0.0
    nvlink_total: float = 0.0

    @property
    def fb_free_mib(self) -> int:
        return max(0, self.fb_total_mib - self.fb_reserved_mib - self.fb_used_mib)


@dataclass
class SimNode:
    hostname: str
    gpus: list[SimGpu]


class GpuUpdate(BaseModel):
    """The fields a test or demo may set. Strict: no strings for numbers, no unknown fields."""

    model_config = ConfigDict(extra="forbid", strict=True)

    util: int | None = Field(default=None, ge=0, le=100)
    mem_copy_util: int | None = Field(default=None, ge=0, le=100)
    enc_util: int | None = Field(default=None, ge=0, le=100)
    dec_util: int | None = Field(default=None, ge=0, le=100)
    fb_used_mib: int | None = Field(default=None, ge=0)
    temp_c: int | None = Field(default=None, ge=0, le=150)
    memory_temp_c: int | None = Field(default=None, ge=0, le=150)
    power_w: float | None = Field(default=None, ge=0, le=2000)
    sm_clock_mhz: int | None = Field(default=None, ge=0, le=5000)
    mem_clock_mhz: int | None = Field(default=None, ge=0, le=20000)
    xid: int | None = Field(default=None, ge=0, le=2**31 - 1)
    gr_engine_active: float | None = Field(default=None, ge=0, le=1)
    tensor_active: float | None = Field(default=None, ge=0, le=1)
    dram_active: float | None = Field(default=None, ge=0, le=1)
    pcie_tx_bytes_per_s: int | None = Field(default=None, ge=0)
    pcie_rx_bytes_per_s: int | None = Field(default=None, ge=0)
    nvlink_bytes_per_s: int | None = Field(default=None, ge=0)
    pcie_replays: int | None = Field(default=None, ge=0)
    correctable_remapped_rows: int | None = Field(default=None, ge=0)
    uncorrectable_remapped_rows: int | None = Field(default=None, ge=0)
    row_remap_failure: int | None = Field(default=None, ge=0, le=1)
    hpc_jobs: list[str] | None = Field(default=None, max_length=16)


SETTABLE_FIELDS = tuple(GpuUpdate.model_fields)
_MONOTONIC_FIELDS = ("pcie_replays", "correctable_remapped_rows", "uncorrectable_remapped_rows")


def _parse_update(fields: dict[str, Any]) -> GpuUpdate:
    try:
        update = GpuUpdate.model_validate(fields)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            name = ".".join(str(p) for p in err["loc"]) or "body"
            if err["type"] == "extra_forbidden":
                problems.append(f"unknown field '{name}'")
            else:
                problems.append(f"field '{name}' = {err.get('input')!r}: {err['msg']}")
        raise InputError(
            "invalid GPU update: " + "; ".join(problems),
            hint=f"settable fields are: {', '.join(SETTABLE_FIELDS)}",
        ) from None
    for job in update.hpc_jobs or []:
        if not _SAFE_LABEL_VALUE.match(job):
            raise InputError(
                f"invalid hpc_jobs entry {job!r}",
                hint="a job id is 1-128 characters: letters, digits, space and ._:/@+-",
            )
    return update


def _check_against(gpu: SimGpu, update: GpuUpdate) -> None:
    if update.fb_used_mib is not None and update.fb_used_mib > gpu.fb_total_mib - gpu.fb_reserved_mib:
        raise InputError(
            f"fb_used_mib={update.fb_used_mib} is more than GPU {gpu.index} has "
            f"({gpu.fb_total_mib - gpu.fb_reserved_mib} MiB usable)",
            hint="use a value between 0 and the usable framebuffer",
        )
    for name in _MONOTONIC_FIELDS:
        new = getattr(update, name)
        if new is not None and new < getattr(gpu, name):
            raise InputError(
                f"{name} is a counter and cannot go down on GPU {gpu.index} "
                f"(now {getattr(gpu, name)}, asked {new})",
                hint="counters only grow until the GPU is reset; set a value >= the current one",
            )


def stable_gpu_uuid(hostname: str, index: int) -> str:
    """The same node and index always get the same UUID, so incidents survive simulator restarts."""
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{hostname}/gpu{index}.argus-dcgm-sim"))


def _bus_id(index: int) -> str:
    bus = _HGX_BUSES[index] if index < len(_HGX_BUSES) else f"{(0xC0 + index) & 0xFF:02X}"
    return f"00000000:{bus}:00.0"


def build_node(hostname: str, gpus: int, model_name: str = DEFAULT_MODEL_NAME) -> SimNode:
    return SimNode(
        hostname=hostname,
        gpus=[
            SimGpu(index=i, uuid=stable_gpu_uuid(hostname, i), pci_bus_id=_bus_id(i), model_name=model_name)
            for i in range(gpus)
        ],
    )


# (field, Prometheus type, HELP, value) in the order of dcgm-exporter's etc/default-counters.csv.
# The value is an int (printed as an integer, DCGM int64 fields) or a float (printed with %f).
@dataclass(frozen=True)
class Counter:
    name: str
    prom_type: str
    help: str
    value: Callable[[SimGpu], int | float]


# How the simulator makes up each default counter's value (the list itself, its types and HELP texts are
# dcgm-exporter's: collectors/dcgm_fields.py).
_SIM_VALUES: dict[str, Callable[[SimGpu], int | float]] = {
    "DCGM_FI_DEV_SM_CLOCK": lambda g: g.sm_clock_mhz,
    "DCGM_FI_DEV_MEM_CLOCK": lambda g: g.mem_clock_mhz,
    "DCGM_FI_DEV_MEMORY_TEMP": lambda g: g.memory_temp_c,
    "DCGM_FI_DEV_GPU_TEMP": lambda g: g.temp_c,
    "DCGM_FI_DEV_POWER_USAGE": lambda g: float(g.power_w),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": lambda g: int(g.energy_mj),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": lambda g: g.pcie_replays,
    "DCGM_FI_DEV_GPU_UTIL": lambda g: g.util,
    "DCGM_FI_DEV_MEM_COPY_UTIL": lambda g: g.mem_copy_util,
    "DCGM_FI_DEV_ENC_UTIL": lambda g: g.enc_util,
    "DCGM_FI_DEV_DEC_UTIL": lambda g: g.dec_util,
    "DCGM_FI_DEV_XID_ERRORS": lambda g: g.xid,
    "DCGM_FI_DEV_FB_FREE": lambda g: g.fb_free_mib,
    "DCGM_FI_DEV_FB_USED": lambda g: g.fb_used_mib,
    "DCGM_FI_DEV_FB_RESERVED": lambda g: g.fb_reserved_mib,
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": lambda g: int(g.nvlink_total),
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": lambda g: g.vgpu_license_status,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": lambda g: g.uncorrectable_remapped_rows,
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": lambda g: g.correctable_remapped_rows,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": lambda g: g.row_remap_failure,
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": lambda g: float(g.gr_engine_active),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": lambda g: float(g.tensor_active),
    "DCGM_FI_PROF_DRAM_ACTIVE": lambda g: float(g.dram_active),
    "DCGM_FI_PROF_PCIE_TX_BYTES": lambda g: g.pcie_tx_bytes_per_s,
    "DCGM_FI_PROF_PCIE_RX_BYTES": lambda g: g.pcie_rx_bytes_per_s,
}
DEFAULT_COUNTERS: tuple[Counter, ...] = tuple(
    Counter(f.name, f.prom_type, f.help, _SIM_VALUES[f.name]) for f in dcgm_fields.DEFAULT_COUNTERS
)


def _format_value(value: int | float) -> str:
    # Go's %d for DCGM int64 fields, %f (six decimals) for doubles: the exact text the exporter writes.
    return str(value) if isinstance(value, int) else f"{value:f}"


def render_metrics(
    node: SimNode,
    *,
    driver_version: str = DEFAULT_DRIVER_VERSION,
    hostname_label: str = "Hostname",
    counters: tuple[Counter, ...] = DEFAULT_COUNTERS,
) -> str:
    """dcgm-exporter's /metrics text for `node`, as it is now."""
    out: list[str] = []
    for counter in counters:
        out.append(f"# HELP {counter.name} {counter.help}")
        out.append(f"# TYPE {counter.name} {counter.prom_type}")
        for gpu in node.gpus:
            value = counter.value(gpu)
            head = (
                f'gpu="{gpu.index}",UUID="{gpu.uuid}",pci_bus_id="{gpu.pci_bus_id}",device="nvidia{gpu.index}",'
                f'modelName="{gpu.model_name}",{hostname_label}="{node.hostname}",'
                f'DCGM_FI_DRIVER_VERSION="{driver_version}"'
            )
            attrs: dict[str, str] = {}
            if counter.name == "DCGM_FI_DEV_XID_ERRORS":
                attrs["err_code"] = str(gpu.xid)
                attrs["err_msg"] = XID_MESSAGES.get(gpu.xid, UNKNOWN_XID_MESSAGE)
            jobs: list[str | None] = [*gpu.hpc_jobs] or [None]  # one line without the label when no job
            for job in jobs:
                line_attrs = dict(attrs)
                if job is not None:
                    line_attrs["hpc_job"] = job
                tail = "".join(f',{k}="{v}"' for k, v in sorted(line_attrs.items()))
                out.append(f"{counter.name}{{{head}{tail}}} {_format_value(value)}")
    return "\n".join(out) + "\n"


def _check_label_value(what: str, value: str) -> str:
    # The real exporter does not escape label values; keep ours to text that needs no escaping.
    if not _SAFE_LABEL_VALUE.match(value):
        raise ConfigError(
            f"{what} {value!r} cannot be used as a label value",
            hint="use 1-128 characters: letters, digits, space and ._:/@+-",
        )
    return value


class DcgmExporterSim:
    """A dcgm-exporter SIMULATOR serving `/metrics` over real HTTP from a background thread.

    `clock` drives the energy and NVLink counters; `jitter=True` adds small idle noise to temperature,
    power and SM clock that is a pure function of (seed, GPU, time bucket), so runs with one seed and
    one clock serve identical text.
    """

    def __init__(
        self,
        hostname: str,
        *,
        gpus: int = 8,
        model_name: str = DEFAULT_MODEL_NAME,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] = time.time,
        driver_version: str = DEFAULT_DRIVER_VERSION,
        hostname_label: str = "Hostname",
        jitter: bool = False,
        seed: int = 0,
        jitter_period_s: float = 30.0,
    ) -> None:
        if not 1 <= gpus <= MAX_GPUS:
            raise ConfigError(f"gpus={gpus} is out of range", hint=f"a node has 1 to {MAX_GPUS} GPUs")
        if hostname_label not in HOSTNAME_LABELS:
            raise ConfigError(
                f"hostname_label={hostname_label!r} is not one dcgm-exporter writes",
                hint="use 'Hostname' (every release) or 'hostname' (main branch since 2026)",
            )
        if not 0 <= port <= 65535:
            raise ConfigError(f"port={port} is out of range", hint="use 0 (any free port) to 65535")
        if jitter_period_s <= 0:
            raise ConfigError(
                f"jitter_period_s={jitter_period_s} must be > 0", hint="e.g. 30, the exporter's interval"
            )
        _check_label_value("hostname", hostname)
        _check_label_value("model name", model_name)
        _check_label_value("driver version", driver_version)
        self.node = build_node(hostname, gpus, model_name)
        self.host = host
        self._port = port
        self._clock = clock
        self.driver_version = driver_version
        self.hostname_label = hostname_label
        self.jitter = jitter
        self.seed = seed
        self.jitter_period_s = jitter_period_s
        self._lock = threading.Lock()
        self._last_t = clock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle
    def start(self) -> DcgmExporterSim:
        if self._server is not None:
            return self
        try:
            server = _Server((self.host, self._port), _make_handler(self))
        except OSError as exc:
            raise ConfigError(
                f"dcgm-exporter simulator cannot listen on {self.host}:{self._port}: {exc.strerror or exc}",
                hint="choose another port (0 picks a free one) or stop the process that holds it",
            ) from None
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},  # stop() waits up to one interval
            name=f"dcgm-sim-{self.hostname}",
            daemon=True,
        )
        self._thread.start()
        logger.debug("dcgm-exporter simulator for {} serving {}", self.hostname, self.url)
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        server.close_connections()
        if thread is not None:
            thread.join(timeout=10)

    def __enter__(self) -> DcgmExporterSim:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def hostname(self) -> str:
        return self.node.hostname

    @property
    def port(self) -> int:
        if self._server is None:
            raise InputError("the dcgm-exporter simulator is not running", hint="call start() first")
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:40123 (the exporter's metrics are at url + '/metrics')."""
        return f"http://{self.host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return self.url + "/metrics"

    # ---- state
    def set_gpu(self, index: int, /, **fields: Any) -> dict[str, Any]:
        """Set fields of one GPU; raise InputError (unknown field, wrong type, out of range) or NotFound."""
        update = _parse_update(fields)
        with self._lock:
            gpu = self._gpu(index)
            _check_against(gpu, update)
            self._advance()
            self._apply(gpu, update)
            return self._state(gpu)

    def set_all(self, **fields: Any) -> list[dict[str, Any]]:
        """Set the same fields on every GPU; all or nothing."""
        update = _parse_update(fields)
        with self._lock:
            for gpu in self.node.gpus:
                _check_against(gpu, update)
            self._advance()
            for gpu in self.node.gpus:
                self._apply(gpu, update)
            return [self._state(g) for g in self.node.gpus]

    def state(self) -> dict[str, Any]:
        with self._lock:
            self._advance()
            return {"hostname": self.hostname, "gpus": [self._state(g) for g in self.node.gpus]}

    def render(self) -> str:
        """The /metrics text now (what a scrape returns)."""
        with self._lock:
            self._advance()
            node = self._jittered() if self.jitter else self.node
            return render_metrics(
                node, driver_version=self.driver_version, hostname_label=self.hostname_label
            )

    def _gpu(self, index: int) -> SimGpu:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self.node.gpus):
            raise NotFound(
                f"GPU {index!r} does not exist on simulated node {self.hostname}",
                hint=f"indexes are 0 to {len(self.node.gpus) - 1}",
            )
        return self.node.gpus[index]

    @staticmethod
    def _apply(gpu: SimGpu, update: GpuUpdate) -> None:
        for name, value in update.model_dump(exclude_none=True).items():
            setattr(gpu, name, list(value) if name == "hpc_jobs" else value)

    def _advance(self) -> None:
        # Integrate power and NVLink rate since the last look; a clock that steps back adds nothing.
        now = self._clock()
        dt = max(0.0, now - self._last_t)
        self._last_t = max(self._last_t, now)
        for gpu in self.node.gpus:
            gpu.energy_mj += gpu.power_w * dt * 1000.0
            gpu.nvlink_total += gpu.nvlink_bytes_per_s * dt

    def _jittered(self) -> SimNode:
        bucket = int(self._last_t // self.jitter_period_s)
        gpus = []
        for gpu in self.node.gpus:
            rng = random.Random(f"{self.seed}:{gpu.index}:{bucket}")
            copy = SimGpu(**{**asdict(gpu), "hpc_jobs": list(gpu.hpc_jobs)})
            copy.temp_c = max(0, gpu.temp_c + rng.randint(-1, 1))
            copy.memory_temp_c = max(0, gpu.memory_temp_c + rng.randint(-1, 1))
            copy.power_w = max(0.0, round(gpu.power_w + rng.uniform(-2.0, 2.0), 3))
            copy.sm_clock_mhz = max(0, gpu.sm_clock_mhz + rng.choice((-15, 0, 0, 15)))
            gpus.append(copy)
        return SimNode(self.hostname, gpus)

    @staticmethod
    def _state(gpu: SimGpu) -> dict[str, Any]:
        data = asdict(gpu)
        data["fb_free_mib"] = gpu.fb_free_mib
        data["energy_mj"] = int(gpu.energy_mj)
        data["nvlink_total"] = int(gpu.nvlink_total)
        return data


class _Server(ThreadingHTTPServer):
    """Closes kept-alive connections on stop, so a stopped simulator looks down to pooled clients too."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, address = super().get_request()
        with self._connections_lock:
            self._connections.add(conn)
        return conn, address

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self._connections_lock:
            connections, self._connections = list(self._connections), set()
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the peer


def _make_handler(sim: DcgmExporterSim) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "argus-dcgm-exporter-sim"
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
            logger.trace("dcgm-sim {}: {}", sim.hostname, format % args)

        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(HTTPStatus.OK, sim.render().encode(), METRICS_CONTENT_TYPE)
            elif path == "/health":
                self._send(HTTPStatus.OK, b"OK", "text/plain; charset=utf-8")
            elif path == "/sim/gpus":
                self._json(HTTPStatus.OK, sim.state())
            elif path.startswith("/sim/gpus/"):
                self._route_index(path, lambda i: sim.state()["gpus"][sim._gpu(i).index])
            else:
                self._error(
                    HTTPStatus.NOT_FOUND, f"no such path {path}", "use /metrics, GET/POST /sim/gpus[/<index>]"
                )

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            path = self.path.split("?", 1)[0]
            if path != "/sim/gpus" and not path.startswith("/sim/gpus/"):
                self._error(
                    HTTPStatus.NOT_FOUND, f"no such path {path}", "POST to /sim/gpus or /sim/gpus/<index>"
                )
                return
            body = self._read_json()
            if body is None:
                return
            if path == "/sim/gpus":
                self._guard(lambda: {"hostname": sim.hostname, "gpus": sim.set_all(**body)})
            else:
                self._route_index(path, lambda i: sim.set_gpu(i, **body))

        def do_PUT(self) -> None:  # noqa: N802 - stdlib name
            self._error(HTTPStatus.METHOD_NOT_ALLOWED, "PUT is not supported", "use POST with a JSON object")

        do_DELETE = do_PATCH = do_PUT  # noqa: N815 - stdlib names

        def _route_index(self, path: str, action: Callable[[int], Any]) -> None:
            raw = path[len("/sim/gpus/") :]
            if not raw.isdigit():
                self._error(
                    HTTPStatus.NOT_FOUND,
                    f"GPU index {raw!r} is not a number",
                    "use /sim/gpus/0, /sim/gpus/1 ...",
                )
                return
            self._guard(lambda: action(int(raw)))

        def _guard(self, action: Callable[[], Any]) -> None:
            try:
                result = action()
            except NotFound as exc:
                self._error(HTTPStatus.NOT_FOUND, exc.message, exc.hint)
            except InputError as exc:
                self._error(HTTPStatus.UNPROCESSABLE_ENTITY, exc.message, exc.hint)
            else:
                self._json(HTTPStatus.OK, result)

        def _read_json(self) -> dict[str, Any] | None:
            length_header = self.headers.get("Content-Length")
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked" or length_header is None:
                self._error(
                    HTTPStatus.LENGTH_REQUIRED, "request has no Content-Length", "send a sized JSON body"
                )
                return None
            try:
                length = int(length_header)
            except ValueError:
                self._error(
                    HTTPStatus.BAD_REQUEST, f"bad Content-Length {length_header!r}", "send a sized JSON body"
                )
                return None
            if length < 0 or length > MAX_BODY_BYTES:
                self.close_connection = True
                self._error(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                    f"body of {length} bytes is over the {MAX_BODY_BYTES}-byte limit",
                    "send only the fields to change",
                )
                return None
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                self._error(HTTPStatus.BAD_REQUEST, f"body is not JSON: {exc}", 'send e.g. {"util": 95}')
                return None
            if not isinstance(body, dict):
                self._error(
                    HTTPStatus.BAD_REQUEST,
                    f"body must be a JSON object, not {type(body).__name__}",
                    'send e.g. {"util": 95, "xid": 79}',
                )
                return None
            return body

        def _error(self, status: HTTPStatus, message: str, hint: str | None) -> None:
            self._json(status, {"error": message, "hint": hint, "status": status.value})

        def _json(self, status: HTTPStatus, payload: Any) -> None:
            self._send(status, json.dumps(payload).encode(), "application/json")

        def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

    return Handler
