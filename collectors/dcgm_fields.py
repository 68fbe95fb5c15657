"""The metrics dcgm-exporter serves out of the box: the counters of its `etc/default-counters.csv`, in that
file's order, with the file's Prometheus types and HELP texts.

Dashboards and rules may read these on any cluster that runs dcgm-exporter unchanged (the dashboards check
refuses other DCGM names); the DCGM simulator serves exactly this list.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DcgmField:
    name: str  # the Prometheus metric name, e.g. DCGM_FI_DEV_GPU_UTIL
    prom_type: str  # "gauge" or "counter"
    help: str


DEFAULT_COUNTERS: tuple[DcgmField, ...] = (
    DcgmField("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    DcgmField("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    DcgmField("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    DcgmField("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    DcgmField("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    DcgmField("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    DcgmField("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    DcgmField("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    DcgmField("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    DcgmField("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %)."),
    DcgmField("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
    DcgmField("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    DcgmField("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    DcgmField("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    DcgmField("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
    DcgmField("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter",
              "Total number of NVLink bandwidth counters for all lanes."),
    DcgmField("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status"),
    DcgmField("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors"),
    DcgmField("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors"),
    DcgmField("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    DcgmField("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    DcgmField("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    DcgmField("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
              "Ratio of cycles the device memory interface is active sending or receiving data."),
    DcgmField("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge",
              "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads"
              " - in bytes per second."),
    DcgmField("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge",
              "The rate of data received over the PCIe bus - including both protocol headers and data payloads"
              " - in bytes per second."),
)
