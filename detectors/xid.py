"""NVIDIA Xid codes as data: what each means and what to do, and a parser for the kernel's Xid lines.

Classes follow the "Resolution Bucket (Immediate Action)" column of NVIDIA's Xid catalog for Ampere and
newer GPUs (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html):

- drain_and_reset: RESET_GPU, RESTART_BM, WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR. The GPU (or the node)
  must be taken out of service and reset or rebooted before it runs work again.
- application: RESTART_APP / IGNORE for faults a program causes (bad memory access, an exception in a
  kernel) and their follow-ups. Restart the job; the GPU is fine.
- investigate: IGNORE / RESTART_APP for memory events the GPU contained or repaired itself. Keep the
  GPU in service and watch it: repeats mean failing memory.

`DCGM_FI_DEV_XID_ERRORS` holds the last Xid a GPU reported, so the metric rules read codes from it; the
log rules read the same codes from kernel lines such as
`NVRM: Xid (PCI:0000:10:00): 79, pid=0, GPU has fallen off the bus.`
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"


class XidClass(str, Enum):
    DRAIN_AND_RESET = "drain_and_reset"
    APPLICATION = "application"
    INVESTIGATE = "investigate"


@dataclass(frozen=True)
class XidInfo:
    code: int
    meaning: str  # NVIDIA's description
    xid_class: XidClass
    nvidia_action: str  # the catalog's immediate-action bucket, as NVIDIA names it
    action: str  # what Argus recommends, one sentence

    @property
    def hardware(self) -> bool:
        return self.xid_class is not XidClass.APPLICATION


_DRAIN = XidClass.DRAIN_AND_RESET
_APP = XidClass.APPLICATION
_WATCH = XidClass.INVESTIGATE

_RESET = (
    "Drain the node (stop scheduling on it, let Argus resubmit its jobs from their last checkpoint), "
    "reset the GPU with `nvidia-smi -r` once no process uses it, and replace it if the Xid returns."
)
_RESTART_APP = (
    "Restart the job from its last checkpoint; the GPU stays in service. If the same code keeps coming "
    "from one job, debug its CUDA code (compute-sanitizer); if from one GPU only, run DCGM diagnostics on it."
)

CATALOG: dict[int, XidInfo] = {
    x.code: x
    for x in (
        XidInfo(8, "GPU stopped processing", _APP, "RESTART_APP", _RESTART_APP),
        XidInfo(13, "Graphics Engine Exception", _APP, "RESTART_APP", _RESTART_APP),
        XidInfo(31, "GPU memory page fault", _APP, "RESTART_APP", _RESTART_APP),
        XidInfo(
            43, "GPU stopped processing", _APP, "IGNORE",
            "A channel of the application was reset after an earlier fault; restart the job and read the "
            "Xid logged just before this one, which is the cause.",
        ),
        XidInfo(
            45, "Preemptive cleanup, due to previous errors", _APP, "WORKFLOW_XID_45",
            "The driver cleaned up after processes were killed or hit an earlier fault; restart the job and "
            "read the Xid logged just before this one, which is the cause.",
        ),
        XidInfo(46, "GPU stopped processing", _DRAIN, "RESET_GPU", _RESET),
        XidInfo(
            48, "Double Bit ECC Error", _DRAIN, "WORKFLOW_XID_48",
            "Drain the node and reset the GPU so the bad page is retired or the row remapped; replace the "
            "GPU if Xid 64 or a row-remap failure follows, or if double-bit errors recur.",
        ),
        XidInfo(62, "Internal micro-controller halt", _DRAIN, "RESET_GPU", _RESET),
        XidInfo(
            63, "ECC page retirement or row remapping recording event", _WATCH, "IGNORE",
            "A row was marked for remapping; keep the GPU in service and reset it at the next drain to "
            "activate the remap (after a Xid 48 that reset is due now).",
        ),
        XidInfo(
            64, "ECC page retirement or row remapper recording failure", _DRAIN, "RESET_GPU",
            "Drain the node and reset the GPU; a failed page retirement or row remap means the memory cannot "
            "repair itself any more: plan to replace the GPU.",
        ),
        XidInfo(
            74, "NVLink Error", _DRAIN, "WORKFLOW_NVLINK_ERR",
            "Drain the node and reset the GPUs on the failing NVLink (with the fabric manager on NVSwitch "
            "systems); replace the GPU or baseboard if the link errors return.",
        ),
        XidInfo(
            79, "GPU has fallen off the bus", _DRAIN, "RESTART_BM",
            "Drain the node and reboot it (a GPU that fell off the PCIe bus cannot be reset in place); check "
            "its power and seating, and replace it if it falls off again.",
        ),
        XidInfo(
            92, "High single-bit ECC error rate", _WATCH, "IGNORE",
            "Corrected errors are frequent on this GPU; keep it in service and watch for Xid 48, 63, 64 or "
            "remapped rows, which mean the memory is failing.",
        ),
        XidInfo(
            94, "Contained ECC error", _WATCH, "RESTART_APP",
            "The GPU contained an uncorrectable memory error: only the process that touched it dies. Restart "
            "that job; the GPU keeps working, and a row remap is pending for its next reset. Repeats mean "
            "failing memory: drain and reset it.",
        ),
        XidInfo(95, "Uncontained ECC error", _DRAIN, "RESET_GPU", _RESET),
        XidInfo(109, "Context Switch Timeout Error", _DRAIN, "RESET_GPU", _RESET),
        XidInfo(
            119, "GSP RPC Timeout", _DRAIN, "RESET_GPU",
            _RESET + " Repeats across nodes after a driver change point at the GSP firmware: check the driver.",
        ),
        XidInfo(
            120, "GSP Error", _DRAIN, "RESET_GPU",
            _RESET + " Repeats across nodes after a driver change point at the GSP firmware: check the driver.",
        ),
        XidInfo(136, "Link Training Failed", _DRAIN, "RESET_GPU", _RESET),
        XidInfo(140, "Unrecovered ECC Error", _DRAIN, "RESET_GPU", _RESET),
        XidInfo(143, "GPU Initialization Failure", _DRAIN, "RESET_GPU", _RESET),
        XidInfo(
            154, "GPU Recovery Action Changed", _WATCH, "XID_154",
            "The driver states the recovery it needs in the message (None, Drain P2P, Drain and Reset, GPU "
            "Reset Required, Node Reboot Required); follow it.",
        ),
        XidInfo(158, "GPU Fatal Timeout", _DRAIN, "RESET_GPU", _RESET),
    )
}


def lookup(code: int) -> XidInfo | None:
    return CATALOG.get(code)


def codes(xid_class: XidClass) -> frozenset[int]:
    return frozenset(c for c, x in CATALOG.items() if x.xid_class is xid_class)


def describe(code: int) -> str:
    """One line naming the Xid, its meaning and its class, for summaries."""
    info = CATALOG.get(code)
    if info is None:
        return f"Xid {code} (not in Argus's catalog; see {CATALOG_URL})"
    kind = {
        XidClass.DRAIN_AND_RESET: "hardware: drain and reset",
        XidClass.APPLICATION: "application error, not hardware",
        XidClass.INVESTIGATE: "hardware event the GPU handled: watch it",
    }[info.xid_class]
    return f"Xid {code} ({info.meaning}; {kind})"


@dataclass(frozen=True)
class KernelXid:
    """One `NVRM: Xid` kernel line, parsed."""

    pci: str
    code: int
    pid: str | None
    process: str | None
    message: str

    @property
    def info(self) -> XidInfo | None:
        return CATALOG.get(self.code)


# Seen forms: "NVRM: Xid (PCI:0000:10:00): 79, pid=0, GPU has fallen off the bus.", older
# "NVRM: Xid (0000:01:00): 3, C 00000005 ...", newer "..., pid='<unknown>', name=<unknown>, ...".
KERNEL_XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): "
    r"(?P<code>\d{1,4})\b,?\s?(?P<rest>[^\n]{0,2000})"
)
_PID_RE = re.compile(r"^pid=(?P<q>'?)(?P<pid>[^,']{0,64})(?P=q),\s?")
_NAME_RE = re.compile(r"^name=(?P<name>[^,]{0,128}),\s?")


def parse_kernel_xid(line: str) -> KernelXid | None:
    """The Xid in a kernel log line, or None when the line holds none."""
    m = KERNEL_XID_RE.search(line)
    if m is None:
        return None
    rest = m.group("rest")
    pid = process = None
    pm = _PID_RE.match(rest)
    if pm:
        pid, rest = pm.group("pid"), rest[pm.end():]
        nm = _NAME_RE.match(rest)
        if nm:
            process, rest = nm.group("name"), rest[nm.end():]
    return KernelXid(pci=m.group("pci"), code=int(m.group("code")), pid=pid, process=process, message=rest.strip())
