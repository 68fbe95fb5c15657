"""One Ray job (variable: submission_id): its GPUs' utilisation, memory, power and temperature, its step
rate, and Argus's incidents as annotations. Built by `argus dashboards build` into job.json."""

from argus_panels import (
    argus_dashboard,
    incident_annotation,
    node_ip,
    query_variable,
    row,
    stat,
    table,
    target,
    targets,
    timeseries,
)

JOB = 'submission_id="$submission_id"'
JOB_GPUS = f"argus_job_gpus{{{JOB}}}"


def on_job_nodes(dcgm_expr: str) -> str:
    """The DCGM series of the nodes where the job holds GPUs.

    Ray does not say which GPU indices a job got, so on a node the job shares with another job this shows
    every GPU of the node; on nodes the job has to itself (the usual case for training) it is exact.
    """
    return f"{node_ip(dcgm_expr)} and on (node_ip) {JOB_GPUS}"


GPU_LEGEND = "{{node_ip}} GPU {{gpu}}"

panels = [
    row("Placement"),
    stat("GPUs held", [target(f"sum({JOB_GPUS})")], description="GPUs the job holds, over all its nodes."),
    stat("Nodes", [target(f"count({JOB_GPUS})")], description="Nodes where the job holds GPUs."),
    stat("Mean GPU utilisation", [target(f"avg({on_job_nodes('DCGM_FI_DEV_GPU_UTIL')})")], unit="percent",
         no_value="no data"),
    stat("Last step", [target(f"max(argus_job_step{{{JOB}}})")], no_value="none seen",
         description="The last training step Argus read in the job's logs."),
    table(
        "Where the job runs",
        [target(f"sum by (node_ip, node_id, owner, job_id) ({JOB_GPUS})", instant=True, table=True)],
        rename={"node_ip": "node", "Value": "GPUs"}, width=24, height=5,
    ),
    row("GPUs"),
    timeseries("GPU utilisation", targets((on_job_nodes("DCGM_FI_DEV_GPU_UTIL"), GPU_LEGEND)),
               unit="percent", max_value=100, legend_table=True,
               description="DCGM_FI_DEV_GPU_UTIL of the GPUs on the job's nodes."),
    timeseries("GPU memory used", targets((on_job_nodes("DCGM_FI_DEV_FB_USED * 1048576"), GPU_LEGEND)),
               unit="bytes", legend_table=True, description="Framebuffer memory in use (DCGM_FI_DEV_FB_USED)."),
    timeseries("GPU power", targets((on_job_nodes("DCGM_FI_DEV_POWER_USAGE"), GPU_LEGEND)),
               unit="watt", legend_table=True),
    timeseries("GPU temperature", targets((on_job_nodes("DCGM_FI_DEV_GPU_TEMP"), GPU_LEGEND)),
               unit="celsius", legend_table=True),
    row("Progress"),
    timeseries(
        "Step rate",
        targets(
            (f"deriv(argus_job_step{{{JOB}}}[$__rate_interval])", "steps/s (from step counter)"),
            (f"1 / argus_job_step_interval_seconds{{{JOB}}}", "steps/s (last step interval)"),
        ),
        unit="short",
        description="Training steps per second, from the step numbers Argus reads in the job's logs.",
    ),
    timeseries("Step", targets((f"argus_job_step{{{JOB}}}", "step")), unit="short",
               description="The last training step Argus has seen; a flat line while GPUs idle is a stall."),
    row("Training metrics"),
    table("W&B run", [target(f"argus_job_info{{{JOB}}}", instant=True, table=True)],
          rename={"wandb_project": "W&B project", "wandb_url": "W&B run"}, link_columns={"W&B run": "open the run"},
          hide=("Value", "__name__", "job", "instance", "name", "owner", "workload", "submission_id"),
          width=24, height=3,
          description="A job submitted with `wandb:` logs to this project; its run id is the submission id. Offline "
                      "runs are in the job's folder (jobs/<submission id>/wandb) until `wandb sync`."),
    timeseries("Loss", targets(*((f'argus_job_train_metric{{{JOB}, metric="{m}"}}', m)
                                 for m in ("loss", "pg_loss", "vf_loss"))), legend_table=True,
               description="From the job's step lines (verl, Hugging Face Trainer, Megatron). NaN and spikes open a "
                           "training_anomaly incident."),
    timeseries("Gradient norm", targets(*((f'argus_job_train_metric{{{JOB}, metric="{m}"}}', m)
                                          for m in ("grad_norm", "critic_grad_norm"))), legend_table=True),
    timeseries("Step time", targets((f'argus_job_train_metric{{{JOB}, metric="step_time"}}', "seconds per step")),
               unit="s", description="What the trainer reports (verl's timing_s/step); doubling for several steps "
                                     "is a straggler suspect."),
    timeseries("Reward and entropy", targets(*((f'argus_job_train_metric{{{JOB}, metric="{m}"}}', m)
                                               for m in ("score", "entropy", "response_clip_ratio"))),
               legend_table=True, description="RL runs: reward (critic/score/mean), entropy, and the share of "
                                              "responses cut at the length cap."),
    timeseries("Learning rate and throughput", targets(*((f'argus_job_train_metric{{{JOB}, metric="{m}"}}', m)
                                                         for m in ("lr", "throughput"))), legend_table=True),
    timeseries("Step time breakdown", targets((f'argus_job_train_metric{{{JOB}, metric=~"timing_.*"}}',
                                               "{{metric}}")),
               unit="s", stacked=True, legend_table=True, description="verl's timing_s/* per phase."),
]

dashboard = argus_dashboard(
    "Argus / Job", "argus-job", "One Ray job: its GPUs, its progress and Argus's incidents about it.",
    panels, variables=[query_variable("submission_id", "Job (submission id)",
                                      "label_values(argus_job_gpus, submission_id)")],
    incidents=incident_annotation(JOB), time_from="now-6h", refresh="30s",
)
