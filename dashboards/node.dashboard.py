"""One node (variable: node, its IP): DCGM utilisation, memory, temperature, power, Xid, NVLink and PCIe
replays per GPU; Ray's view of the node's CPU, memory and disk. Built by `argus dashboards build`."""

from argus_panels import (
    argus_dashboard,
    incident_annotation,
    on_node,
    query_variable,
    row,
    stat,
    table,
    target,
    targets,
    timeseries,
)

# dcgm-exporter's series of this node: scraped at <node IP>:<port>.
DCGM_ON_NODE = on_node("node")
RAY_NODE = 'ip="$node"'  # Ray's node metrics name their node in `ip`
GPU = "GPU {{gpu}}"


def dcgm(name: str) -> str:
    return f"{name}{{{DCGM_ON_NODE}}}"


panels = [
    row("Node"),
    stat("GPUs", [target(f"count({dcgm('DCGM_FI_DEV_GPU_UTIL')})")], no_value="none seen",
         description="GPUs dcgm-exporter reports on this node."),
    stat("dcgm-exporter up", [target(f'min(up{{job=~".*dcgm.*", {DCGM_ON_NODE}}})')], no_value="no target"),
    stat("GPUs held by jobs", [target('sum(argus_job_gpus{node_ip="$node"})')]),
    stat("Ray CPUs", [target(f"sum(ray_node_cpu_count{{{RAY_NODE}}})")], no_value="not in Ray"),
    table(
        "Jobs on this node",
        [target('sum by (submission_id, owner, job_id) (argus_job_gpus{node_ip="$node"})', instant=True,
                table=True)],
        rename={"submission_id": "job", "owner": "user", "Value": "GPUs"}, width=24, height=5,
    ),
    row("GPUs (dcgm-exporter)"),
    timeseries("GPU utilisation (DCGM)", targets((dcgm("DCGM_FI_DEV_GPU_UTIL"), GPU)), unit="percent",
               max_value=100, legend_table=True),
    timeseries(
        "GPU memory used",
        targets((f"{dcgm('DCGM_FI_DEV_FB_USED')} / ({dcgm('DCGM_FI_DEV_FB_USED')} + {dcgm('DCGM_FI_DEV_FB_FREE')})",
                 GPU)),
        unit="percentunit", legend_table=True,
        description="Framebuffer used / (used + free); the reserved part is left out.",
    ),
    timeseries(
        "GPU temperature",
        targets((dcgm("DCGM_FI_DEV_GPU_TEMP"), "GPU {{gpu}}"), (dcgm("DCGM_FI_DEV_MEMORY_TEMP"), "GPU {{gpu}} memory")),
        unit="celsius", legend_table=True,
    ),
    timeseries("GPU power", targets((dcgm("DCGM_FI_DEV_POWER_USAGE"), GPU)), unit="watt", legend_table=True),
    timeseries(
        "Xid errors (last Xid per GPU)",
        targets((dcgm("DCGM_FI_DEV_XID_ERRORS"), "GPU {{gpu}} Xid")),
        legend_table=True,
        description=(
            "DCGM_FI_DEV_XID_ERRORS holds the last Xid a GPU reported (0: none) until the GPU is reset. "
            "48, 64, 79, 95, 140 mean drain and reset; 13, 31, 43, 94 are usually the application."
        ),
    ),
    timeseries(
        "NVLink bandwidth",
        targets((f"rate({dcgm('DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL')}[$__rate_interval])", GPU)),
        legend_table=True,
        description="Per-second rate of DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL (all lanes), in the counter's units.",
    ),
    timeseries(
        "PCIe replays",
        targets((f"increase({dcgm('DCGM_FI_DEV_PCIE_REPLAY_COUNTER')}[$__rate_interval])", GPU)),
        legend_table=True,
        description="PCIe retries per interval; a steady rise points at a bad riser, slot or GPU.",
    ),
    timeseries(
        "Remapped rows",
        targets(
            (dcgm("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"), "GPU {{gpu}} uncorrectable"),
            (dcgm("DCGM_FI_DEV_ROW_REMAP_FAILURE"), "GPU {{gpu}} remap failed"),
        ),
        legend_table=True,
        description="Uncorrectable remapped rows need a GPU reset to take effect; a remap failure means replace.",
    ),
    row("Ray node"),
    timeseries("Ray node CPU", targets((f"ray_node_cpu_utilization{{{RAY_NODE}}}", "CPU")), unit="percent",
               max_value=100, width=8),
    timeseries(
        "Ray node memory",
        targets(
            (f"ray_node_mem_used{{{RAY_NODE}}}", "used"),
            (f"ray_node_mem_total{{{RAY_NODE}}}", "total"),
        ),
        unit="bytes", width=8,
        description="Ray's own memory monitor kills workers above 95% (RAY_memory_usage_threshold).",
    ),
    timeseries(
        "Ray node disk",
        targets(
            (f"ray_node_disk_usage{{{RAY_NODE}}}", "used"),
            (f"ray_node_disk_free{{{RAY_NODE}}}", "free"),
        ),
        unit="bytes", width=8, description="The node's root filesystem as Ray's agent measures it.",
    ),
]

dashboard = argus_dashboard(
    "Argus / Node", "argus-node",
    "One node: its GPUs as dcgm-exporter sees them and its CPU, memory and disk as Ray sees them.",
    panels, variables=[query_variable("node", "Node (IP)", "label_values(ray_node_cpu_utilization, ip)")],
    incidents=incident_annotation('node="$node"'), time_from="now-6h", refresh="30s",
)
