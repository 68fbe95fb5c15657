"""The cluster at a glance: GPU use by node, GPUs allocated vs busy, idle GPUs held by jobs, GPU-hours by
user and job, node health, interruptions per day. Built by `argus dashboards build` into cluster.json."""

from argus_panels import (
    argus_dashboard,
    custom_variable,
    incident_annotation,
    node_ip,
    row,
    stat,
    table,
    target,
    targets,
    timeseries,
)

# A GPU under this utilisation (%) counts as idle, as Argus's idle_gpu detector sees it (default 5).
IDLE_BELOW = "$idle_below"
DCGM_UTIL_BY_NODE_IP = node_ip("DCGM_FI_DEV_GPU_UTIL")
# Nodes where every GPU is under the threshold: per node, as Argus judges idleness (Ray does not say which
# GPU index a job got, so a job's GPUs are known per node only).
IDLE_NODES = f"max by (node_ip) ({DCGM_UTIL_BY_NODE_IP}) < {IDLE_BELOW}"
IDLE_HELD = f"argus_job_gpus and on (node_ip) ({IDLE_NODES})"
# Idle GPUs are waste, a job waiting for a place (unschedulable) never started, and a training anomaly's job runs on:
# none is an interruption.
NOT_INTERRUPTIONS = 'category!~"idle_gpu|unschedulable|training_anomaly"'
# Scrape jobs named as in alert_rules/ (".*ray.*", ".*dcgm.*"); rename in a copy if yours differ.
UP_RAY = 'up{job=~".*ray.*"}'
UP_DCGM = 'up{job=~".*dcgm.*"}'

panels = [
    row("GPUs"),
    stat("GPUs (DCGM)", [target("count(DCGM_FI_DEV_GPU_UTIL)")],
         description="GPUs that dcgm-exporter reports on, over every scraped node."),
    stat("GPUs held by jobs", [target("sum(argus_job_gpus)")],
         description="GPUs held by Ray jobs (actors, tasks, placement groups), from Argus's placement collector."),
    stat("GPUs busy", [target(f"count(DCGM_FI_DEV_GPU_UTIL >= {IDLE_BELOW})")],
         description="GPUs at or above the idle threshold."),
    stat("Idle GPUs held by jobs (now)", [target(f"sum({IDLE_HELD})")],
         description="GPUs held by jobs on nodes where every GPU is under the idle threshold."),
    timeseries(
        "GPU utilisation by node",
        targets((f"avg by (node_ip) ({DCGM_UTIL_BY_NODE_IP})", "{{node_ip}}")),
        unit="percent", max_value=100, legend_table=True,
        description="Mean DCGM_FI_DEV_GPU_UTIL over the GPUs of each node (node = host of the exporter's address).",
    ),
    timeseries(
        "GPUs allocated vs busy",
        targets(
            ('sum(ray_resources{Name="GPU", State="USED"})', "allocated (Ray)"),
            ("sum(argus_job_gpus)", "held by jobs (Argus)"),
            (f"count(DCGM_FI_DEV_GPU_UTIL >= {IDLE_BELOW}) or vector(0)", "busy (DCGM)"),
            ("count(DCGM_FI_DEV_GPU_UTIL)", "total (DCGM)"),
        ),
        description="Allocated: GPUs Ray's raylets report in use. Busy: GPUs at or above the idle threshold.",
    ),
    timeseries(
        "Idle GPUs held by jobs",
        targets((f"sum by (submission_id, owner) ({IDLE_HELD})", "{{submission_id}} ({{owner}})")),
        stacked=True, legend_table=True,
        description=(
            "GPUs a job holds on nodes where every GPU is under the idle threshold. Judged per node: a busy "
            "neighbour on a shared node keeps a job out of this panel, as in Argus's idle_gpu detector."
        ),
    ),
    row("Usage"),
    table(
        "GPU-hours by user",
        [target("sort_desc(sum by (owner) (sum_over_time(argus_job_gpus[$__range:1m])) / 60)",
                instant=True, table=True)],
        rename={"owner": "user", "Value": "GPU-hours"}, sort_by="GPU-hours",
        description="GPUs held, summed minute by minute over the dashboard's time range.",
    ),
    table(
        "GPU-hours by job",
        [target("sort_desc(sum by (submission_id, owner) (sum_over_time(argus_job_gpus[$__range:1m])) / 60)",
                instant=True, table=True)],
        rename={"owner": "user", "submission_id": "job", "Value": "GPU-hours"}, sort_by="GPU-hours",
        description="GPUs held, summed minute by minute over the dashboard's time range.",
    ),
    row("Nodes"),
    stat("Ray nodes alive", [target("sum(ray_cluster_active_nodes)")], no_value="unknown",
         description="Nodes Ray's GCS counts as alive."),
    stat("Open incidents", [target("sum(argus_incidents_open)")],
         description="Argus incidents open or being mitigated."),
    stat("GPUs with an Xid now", [target("count(DCGM_FI_DEV_XID_ERRORS != 0) or vector(0)")],
         description="GPUs whose last reported Xid is not 0 (dcgm-exporter keeps the last Xid until reset)."),
    stat("Exporter targets down", [target('count(up{job=~".*(dcgm|ray).*"} == 0) or vector(0)')],
         description="dcgm-exporter and Ray metrics targets Prometheus cannot scrape."),
    table(
        "Node health",
        [
            target(f'min by (node_ip) ({node_ip(UP_RAY)})', ref="A", instant=True, table=True),
            target(f"min by (node_ip) ({node_ip(UP_DCGM)})", ref="B", instant=True, table=True),
            target(f"count by (node_ip) ({DCGM_UTIL_BY_NODE_IP})", ref="C", instant=True, table=True),
            target(f"max by (node_ip) ({node_ip('DCGM_FI_DEV_XID_ERRORS')})", ref="D", instant=True, table=True),
            target(f"max by (node_ip) ({node_ip('DCGM_FI_DEV_ROW_REMAP_FAILURE')})", ref="E", instant=True,
                   table=True),
            target(f"max by (node_ip) ({node_ip('DCGM_FI_DEV_GPU_TEMP')})", ref="F", instant=True, table=True),
            target("sum by (node_ip) (argus_job_gpus)", ref="G", instant=True, table=True),
        ],
        rename={
            "node_ip": "node",
            "Value #A": "Ray targets up",
            "Value #B": "dcgm-exporter up",
            "Value #C": "GPUs",
            "Value #D": "last Xid (max)",
            "Value #E": "row remap failure",
            "Value #F": "hottest GPU (C)",
            "Value #G": "GPUs held by jobs",
        },
        width=24, height=9,
        description=(
            "One row per node IP. Up: 1 when every scrape target of that kind on the node answers. A node "
            "Ray has dropped disappears from Ray's service discovery, so check 'Ray nodes alive' as well."
        ),
    ),
    row("Job queue"),
    stat("Jobs queued", [target("sum(argus_jobs_queued) or vector(0)")],
         description="Jobs waiting in Argus's queue for their whole gang (nodes × GPUs) to fit in their pool."),
    stat("Queue wait p90 (1d)", [target(
        "histogram_quantile(0.9, sum by (le) (increase(argus_job_queue_wait_seconds_bucket[1d])))")],
        unit="s", no_value="no job started from the queue",
        description="How long jobs waited in the queue before they started, over the last day."),
    stat("Expired in the queue (1d)", [target('sum(increase(argus_job_queue_left_total{outcome="expired"}[1d]))')],
         description="Jobs whose gang did not fit within their queue timeout: `argus jobs queue --state expired` "
                     "says why each waited."),
    timeseries(
        "Jobs queued by pool",
        targets(('sum by (pool) (argus_jobs_queued)', "{{pool}}")),
        stacked=True, legend_table=True,
        description="Waiting jobs by the pool they ask for (empty: any node).",
    ),
    row("Interruptions"),
    timeseries(
        "Interruptions per day by category",
        [target(f"sum by (category) (increase(argus_incidents_opened_total{{{NOT_INTERRUPTIONS}}}[1d]))",
                "{{category}}", interval="1d")],
        bars=True, stacked=True, width=24, legend_table=True,
        description="Incidents Argus opened per day, by category; idle GPUs, jobs waiting for a place "
                    "(unschedulable) and training anomalies (the job runs on) are not interruptions and are left out.",
    ),
]

dashboard = argus_dashboard(
    "Argus / Cluster", "argus-cluster",
    "GPU utilisation, allocation and idleness, GPU-hours, node health and interruptions.",
    panels, variables=[custom_variable("idle_below", "Idle below (% util)", ["5", "1", "10", "20"])],
    incidents=incident_annotation(enabled=False),
)
