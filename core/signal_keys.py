"""The keys of `Signal.attrs` (and the metric names) that collectors write and detectors read.

Collectors and detectors never import each other, so the contract between them lives here: a key spelt
differently on the two sides would make a detector silently see nothing. Findings reuse some of these
keys in their own attrs (`submission_id`, `node_ip`, `jobs`), which core.refs reads.
"""

from __future__ import annotations

from typing import Final

# -- every metric sample ---------------------------------------------------------------------------------
METRIC: Final = "metric"  # the series name
LABELS: Final = "labels"  # the sample's labels, as scraped

# -- GPU samples (dcgm, nvml) --------------------------------------------------------------------------------
HOSTNAME: Final = "hostname"
GPU: Final = "gpu"  # the GPU's index on its host
UUID: Final = "uuid"
MODEL_NAME: Final = "model_name"

# -- log lines ------------------------------------------------------------------------------------------------
STREAM: Final = "stream"  # which rules apply: "job-logs", "raylet", ... (detectors/rules/*.yaml `source`)
FILE: Final = "file"
TRUNCATED: Final = "truncated"  # the line was cut at core.limits.MAX_LINE_BYTES
# Only on lines read from a file's first sight (the backlog Argus found, not lines written while it watched):
LINE_TIME: Final = "line_time"  # when the line was written (its own stamp, else the file's mtime), ISO 8601
HISTORY: Final = "history"  # True: written longer than Settings.history_window_s before it was read; no news

# -- where: nodes and jobs ------------------------------------------------------------------------------------
NODE_ID: Final = "node_id"  # Ray's node id
NODE_IP: Final = "node_ip"
NODE_NAME: Final = "node_name"  # the node's hostname or Ray node name (Ray's default is its IP)
NODES: Final = "nodes"
JOBS: Final = "jobs"  # on a node: the jobs that had work there (dicts as JOB_* below, or ids)
JOB_ID: Final = "job_id"  # Ray's job id
SUBMISSION_ID: Final = "submission_id"
# On a finding about a job, of a fault that struck one host (a host OOM): the node the text names as where it
# happened ("Memory on the node (IP: ..., ID: ...)"), which need not be where the line was written (NODE_ID/NODE_IP).
AFFECTED_NODE_ID: Final = "affected_node_id"
AFFECTED_NODE_IP: Final = "affected_node_ip"
# On a finding from a job's own log line: the job had already ended (FAILED, STOPPED) when the line was read. An
# ended job cannot fail again: such a line is late evidence of a fault already told, not a new one.
JOB_ENDED: Final = "job_ended"

# -- node and job states (ray_state, placement) ---------------------------------------------------------------
STATE: Final = "state"  # a node's: ALIVE, DEAD
STATE_MESSAGE: Final = "state_message"
IS_HEAD_NODE: Final = "is_head_node"
STATUS: Final = "status"  # a job's: PENDING, RUNNING, FAILED, ...
MESSAGE: Final = "message"
ERROR_TYPE: Final = "error_type"
ENTRYPOINT: Final = "entrypoint"
DRIVER_NODE_ID: Final = "driver_node_id"
OWNER: Final = "owner"
JOB_NAME: Final = "job_name"  # the JobSpec name from the job's metadata (core.names.job_identity)
# On a finding about a job: where its GPUs were when Argus last saw them, [{node_id, node_ip, node_name, gpus}]
JOB_PLACEMENT: Final = "job_placement"
START_TIME: Final = "start_time"  # ISO 8601
END_TIME: Final = "end_time"
METADATA: Final = "metadata"  # a job's Ray metadata (str -> str): Argus's name/owner, a resubmission's lineage

# -- what waits for a place, and what is free (ray_state; core.waits words them) -----------------------------
# On a node: what it has in all, and free now ({resource: amount}); free is None when not read this poll (Ray's
# autoscaler report is read only while something waits, and may be missing).
RESOURCES_TOTAL: Final = "resources_total"
RESOURCES_AVAILABLE: Final = "resources_available"
# On a PENDING job: the resources and label selector its driver waits on, as Ray schedules it (its supervisor
# actor's); None when unknown (not PENDING, or the actor not listed).
ENTRYPOINT_RESOURCES: Final = "entrypoint_resources"
LABEL_SELECTOR: Final = "label_selector"
# On a job: its placement groups Ray has not placed (PENDING, or RESCHEDULING after a node loss), as dicts with
# the keys below; None when they were not read this poll.
WAITING_GROUPS: Final = "waiting_groups"
PLACED_GROUPS: Final = "placed_groups"  # on a job: the ids of its placement groups Ray placed (CREATED); None: unread
GROUP_ID: Final = "placement_group_id"
GROUP_NAME: Final = "name"
BUNDLES: Final = "bundles"  # [{resource: amount}] in bundle order
BUNDLE_SELECTORS: Final = "bundle_label_selectors"  # [{label: selector}] in bundle order, {} where none
STRATEGY: Final = "strategy"  # PACK, SPREAD, STRICT_PACK, STRICT_SPREAD; None when Ray's report does not say
SCHEDULING_STATE: Final = "scheduling_state"  # Ray's word for why: NO_RESOURCES, INFEASIBLE, QUEUED, ...
SINCE: Final = "since"  # ISO 8601: when Ray received the group's creation request

# -- storage (statvfs) ------------------------------------------------------------------------------------------
PATH: Final = "path"
TOTAL_BYTES: Final = "total_bytes"
INODES_TOTAL: Final = "inodes_total"
INODES_FREE: Final = "inodes_free"
INODES_AVAIL: Final = "inodes_avail"

# -- metric rules evaluated by a collector, judged by a detector ----------------------------------------------
RULE: Final = "rule"  # the reason of the rule whose query produced the signal
RULE_EVALUATED: Final = "rule_evaluated"  # marks the one signal per evaluated rule that says "I ran"

# -- metric names made by Argus's own collectors --------------------------------------------------------------
STORAGE_FREE_BYTES_METRIC: Final = "storage_free_bytes"
PLACEMENT_METRIC: Final = "argus_gpu_placement"  # one snapshot of where every job's GPUs are
JOB_GPUS_METRIC: Final = "argus_job_gpus"  # one sample per job: how many GPUs it holds

# -- stack samples (rank_stacks): what a suspected hang is confirmed from --------------------------------------
SAMPLES: Final = "samples"  # list of samples, oldest first; each a list of process dicts (collectors.rank_stacks)
SAMPLED_AT: Final = "sampled_at"  # each sample's time, ISO 8601
