"""Whose category stands: the rule engine's, or one an LLM proposes. The LLM writes prose; it may only
change the category where the rules found no failure signature (or only warnings) and the lines it cites
show the category it proposes. Everything else is rejected, and the report says why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from core.types import Category
from detectors.engine import RuleSet
from rca.classify import TIER_GENERIC, TIER_SIGNATURE, Classification, tier

# What each category means, for the prompt and the report.
CATEGORY_MEANINGS: dict[Category, str] = {
    Category.GPU_OOM: "a GPU ran out of memory (CUDA out of memory, NCCL or the rollout engine unable to allocate)",
    Category.HOST_OOM: "a host ran out of memory (kernel OOM killer, SIGKILL / exit 137, Ray's memory monitor)",
    Category.NCCL_HANG: "a collective stopped making progress (watchdog timeout, stalled steps, stuck ranks)",
    Category.NCCL_ERROR: "NCCL or the network failed (connection reset, IB errors, NCCL internal or system errors)",
    Category.NODE_LOST: "a Ray node left the cluster (raylet died, missed heartbeats, node marked dead, preempted)",
    Category.GPU_HARDWARE: "a GPU or its link failed (Xid 48/64/74/79/94/95, ECC errors, fell off the bus)",
    Category.DISK_FULL: "a disk or /dev/shm filled up (No space left on device, failed checkpoint writes, quota)",
    Category.IDLE_GPU: "GPUs were held by a job while idle",
    Category.UNSCHEDULABLE: "a job waited for resources no node could give it (its driver PENDING, or its "
                            "placement groups unplaced)",
    Category.TRAINING_ANOMALY: "the job ran on while its training metrics went wrong (loss or gradients NaN or "
                               "spiking, steps slowing down, an RL policy collapsing)",
    Category.USER_ERROR: "the job's own code or configuration failed (Python exceptions, bad arguments, launch "
                         "mistakes)",
    Category.UNKNOWN: "the evidence shows no clear cause",
}

# Words that show a category in a cited line, beside the rules themselves: the LLM may cite a line no rule
# matched (that is why it is asked), but a line that never mentions memory does not show an OOM. A line must show
# the failure, not only name the subsystem: "NCCL INFO Channel 00 ..." names NCCL and shows no NCCL error, and a
# healthy log is full of such lines (the LLM once called three healthy NCCL logs nccl_error from them).
_FAILED = r"\b(?:error|errors|fail(?:ed|ure|s)?|refused|reset|closed|abort(?:ed)?|unreachable|no route|timed out)\b"
SUPPORT: dict[Category, re.Pattern[str]] = {
    Category.GPU_OOM: re.compile(r"(?i)out of memory|\bOOM\b|OutOfMemory|cudaErrorMemoryAllocation|alloc(?:ate)? fail"),
    # A host's memory use or pressure reported is no OOM: a healthy run prints both (DeepSpeed's see_memory_usage).
    Category.HOST_OOM: re.compile(r"(?i)out of memory|\bOOM\b|oom[-_ ]?kill|SIGKILL|signal 9|"
                                  r"exit(?:ed)? (?:code|status) -?(?:137|9)\b|\bKilled\b(?! 0\b)|"
                                  r"low on memory|cannot allocate memory"),
    # A watchdog named is not one that fired ("watchdog thread started"): it shows a hang where it timed out or caught.
    Category.NCCL_HANG: re.compile(r"(?i)timed out|\btimeout\b(?!\s{0,3}[=:]\s{0,3}\d)|\bhang(?:s|ing)?\b|"
                                   r"\bhung\b|\bstuck\b|no progress|\bstall(?:s|ed)?\b|"
                                   r"watchdog\b[^\n]{0,80}\b(?:caught|fired|abort\w{0,3}|terminat\w{0,6})\b"),
    # NCCL's WARN that libibverbs or a net plugin is missing is its fall-back to sockets, not a failure
    Category.NCCL_ERROR: re.compile(r"(?i)^(?![^\n]*(?:\bINFO\b|libibverbs|plugin|fall(?:ing)? ?back))"
                                    r"(?=[^\n]*(?:\bNCCL\b|\bNET/|ibv_|mlx5|\bgloo\b|\bc10d\b|"
                                    r"socket|connection))[^\n]*" + _FAILED),
    # "preemption" as a feature ("preemptible nodes", "preemption enabled") is not a node taken away.
    Category.NODE_LOST: re.compile(r"(?i)marked (?:as )?dead|\bpre-?empted\b|\bpre-?emption (?:notice|event|detected)|"
                                   r"\b(?:node|raylet|host|instance|worker|machine|"
                                   r"gcs)\b[^\n]{0,160}\b(?:dead|died|lost|down|unreachable|terminated|failed|"
                                   r"failure|timed out|disconnected|not responding)\b|heartbeats?\b[^\n]{0,80}"
                                   r"\b(?:missed|lost|failed|timed out)\b"),
    # ECC, NVLink and PCIe named are a GPU's parts, not its faults ("NVLink detected", "PCIe Gen4 x16", "ECC: On").
    Category.GPU_HARDWARE: re.compile(r"(?i)\bXid\b|fallen off the bus|uncorrectable|row remap\w{0,4} fail|"
                                      r"\b(?:ECC|NVLink|PCIe)\b[^\n]{0,80}?\b(?:errors?|fault\w{0,2}|fail\w{0,4}|down)\b"
                                      r"(?![^\n]{0,16}?[:=]\s{0,4}0\b)|device handle|GPU has fallen"),
    # /dev/shm named is not /dev/shm full: Ray warns it uses /tmp when /dev/shm is small, and the run goes on
    Category.DISK_FULL: re.compile(r"(?i)no space|disk (?:quota|full)|ENOSPC|errno 28|quota exceeded|"
                                   r"/dev/shm\b[^\n]{0,80}?\b(?:is full|full\b|too small to|failed|cannot|unable)"),
    Category.IDLE_GPU: re.compile(r"(?i)idle|utili[sz]ation"),
    Category.UNSCHEDULABLE: re.compile(r"(?i)\bPENDING\b|infeasible|unschedulable|placement group|cannot be scheduled|"
                                       r"no node (?:offer|ha)"),
    Category.TRAINING_ANOMALY: re.compile(r"(?i)\b(?:loss|grad(?:ient)?[ _]?norm)\b[^\n]{0,40}\b(?:nan|inf)\b|"
                                          r"\bentropy\b|clip_ratio|timing_s/step"),
    Category.USER_ERROR: re.compile(r"(?i)Error\b|Exception\b|Traceback|invalid|not found|unexpected|assert"),
}

LLM_ONLY_CONFIDENCE_CAP = 0.5
# What only an observation shows: GPUs idle while held (their metrics over a window) and a job that waits for a place
# (its driver PENDING in Ray's state). A log line may mention either ("cannot be scheduled right now", an idle node
# ended by the autoscaler) while the run goes on, so the LLM's reading of logs never sets them.
# Training anomalies too: a series judged over many steps (detectors/training_health.py), not one line's reading.
OBSERVED_ONLY = frozenset({Category.IDLE_GPU, Category.UNSCHEDULABLE, Category.TRAINING_ANOMALY})

# A line's own log level, where it states one (Python's and NCCL's words, glog's letter in Ray's C++ logs). A line
# logged at INFO or DEBUG reports the run going on, and a WARNING shows a failure only in failure words: Ray warns that
# a task "cannot be scheduled right now" and the autoscaler logs at INFO that it ends an idle node, and both runs go on.
# Such a line does not make the LLM's category stand where no rule saw a failure (measured: the small LLM turned those
# two healthy logs into unschedulable and idle_gpu; NCCL reports its real errors at WARN, with failure words).
# glog's letter comes first in Ray's C++ logs ("[2025-02-11 20:08:00,117 I 4121 4121] main.cc:284:") and in
# TensorFlow's and absl's ("W tensorflow/core/common_runtime/bfc_allocator.cc:237]", "I0512 10:00:00.1 1 f.cc:12]",
# after a timestamp and ": " in TensorFlow 1.x).
_LEVEL = re.compile(r"\b(?P<word>INFO|DEBUG|TRACE|NOTICE|WARN(?:ING)?|ERROR|FATAL|CRITICAL)\b|"
                    r"^\[[^\]]{0,40}\s(?P<letter>[IWEF])\s\d+\s\d+\]|"
                    r"(?:^|:\s)(?P<glog>[IWEF])(?:\d{4}\s[\d:.]{8,16}\s{1,4}\d{1,10})?\s[\w./-]{1,200}\.(?:cc|cpp|h|py):\d+\]")
# A line that says itself it is no failure ("The caller indicates that this is not a failure", "can be safely
# ignored") does not show one, whatever words it holds: TensorFlow's allocator warning reads "ran out of memory" and
# the small LLM took it for a GPU OOM on a healthy run (measured on rounds 15-16 of the evaluation set).
# Advice that guesses shows nothing either: vLLM prints "No available shared memory broadcast block found in 60
# seconds. This typically happens when some processes are hanging or doing some time-consuming work" for every slow
# step, and the small LLM read a healthy run's model loading as an NCCL hang from it (dev case 313); the generic rules
# void the same hedges (detectors/rules/generic.yaml, GenericCollectiveTimeout).
_DISCLAIMS = re.compile(r"(?i)\b(?:is|was|are) not (?:a |an )?(?:failure|error|problem)\b|\bnot a failure\b|"
                        r"\b(?:can|may) (?:be )?(?:safely )?ignored?\b|\bsafe to ignore\b|\bharmless\b|\bbenign\b|"
                        r"\b(?:typically|usually|often|sometimes) (?:happens|occurs|means|indicates)\b|"
                        r"\bthis (?:can|may|might|could) (?:happen|occur|mean|indicate)\b|"
                        r"\bpossible (?:reasons|causes)\b")
_ROUTINE_LEVELS = frozenset({"INFO", "DEBUG", "TRACE", "NOTICE", "I"})
_WARNING_LEVELS = frozenset({"WARN", "WARNING", "W"})


def _routine(text: str) -> bool:
    """The line is logged at a level that says the run goes on, and says nothing of a failure; or it says itself
    that it is no failure, or only guesses at one."""
    if _DISCLAIMS.search(text[:4096]):
        return True
    found = _LEVEL.search(text[:200])
    if found is None:
        return False
    level = found.group("word") or found.group("letter") or found.group("glog")
    if level in _ROUTINE_LEVELS:
        return True
    return level in _WARNING_LEVELS and not re.search(_FAILED, text[:4096], re.IGNORECASE)


@dataclass(frozen=True)
class Decision:
    category: Category
    confidence: float
    llm_category: Category
    accepted: bool  # the LLM's category (and so its prose) stands
    note: str


def decide(verdict: Classification, llm_category: Category | str, llm_confidence: float, cited: list[str],
           rules: RuleSet, *, detected: bool = False) -> Decision:
    """The category of the report, given the deterministic verdict and the LLM's proposal with the texts of
    the lines it cites (only lines that exist in the bundle). `detected`: the verdict comes from a detector
    that saw the fault itself (Ray's node state, DCGM metrics), which no reading of logs overrules."""
    try:
        proposed = Category(llm_category)
    except ValueError:
        return Decision(verdict.category, verdict.confidence, Category.UNKNOWN, False,
                        f"the LLM proposed {str(llm_category)[:40]!r}, which is not a category; the rule engine's "
                        f"{verdict.category.value} stands")
    if proposed is verdict.category:
        return Decision(verdict.category, verdict.confidence, proposed, True,
                        f"the LLM agrees with the rule engine: {proposed.value}")
    strength = tier(verdict)
    if detected:
        return Decision(verdict.category, verdict.confidence, proposed, False,
                        f"the LLM proposed {proposed.value}; rejected: {verdict.category.value} was observed directly "
                        f"({verdict.reason}), not read from logs")
    if strength >= TIER_GENERIC:
        # A generic rule's reading stands as well: the LLM's category replaces only "no failure found", so the
        # LLM-assisted verdict can add to the rules and never undo one of them.
        line = verdict.evidence[0] if verdict.evidence else None
        shown = f" ({line[0]}:{line[1]}: {line[2][:160]})" if line else ""
        return Decision(verdict.category, verdict.confidence, proposed, False,
                        f"the LLM proposed {proposed.value}; rejected: the failure signature {verdict.reason}{shown} "
                        f"shows {verdict.category.value}, and the LLM's reading does not overrule a matched "
                        f"{'signature' if strength >= TIER_SIGNATURE else 'generic rule'}")
    if proposed in OBSERVED_ONLY:
        return Decision(verdict.category, verdict.confidence, proposed, False,
                        f"the LLM proposed {proposed.value}; rejected: Argus decides {proposed.value} from what it "
                        "observes (GPU metrics, Ray's scheduling state), not from log lines")
    supporting = [t for t in cited if _shows(proposed, t, rules) and not _routine(t)]
    if proposed is Category.UNKNOWN:
        return Decision(verdict.category, verdict.confidence, proposed, False,
                        f"the LLM found no clear cause; the rule engine's {verdict.category.value} (from warnings "
                        "only) stands, with its low confidence")
    if not supporting:
        why = "cites no evidence line" if not cited else f"cites no line that shows {proposed.value} (lines logged " \
              "at INFO, or warnings without a failure word, show the run going on)"
        return Decision(verdict.category, verdict.confidence, proposed, False,
                        f"the LLM proposed {proposed.value}; rejected: it {why}")
    confidence = round(min(LLM_ONLY_CONFIDENCE_CAP, max(0.0, llm_confidence)), 2)
    basis = "no failure signature matched" if strength == 0 else f"only warnings matched ({verdict.reason})"
    return Decision(proposed, confidence, proposed, True,
                    f"the LLM's {proposed.value} was accepted because {basis} and {len(supporting)} cited line(s) "
                    f"show it; confidence capped at {LLM_ONLY_CONFIDENCE_CAP}")


def _shows(category: Category, text: str, rules: RuleSet) -> bool:
    if any(rule.category is category for rule in rules.match(text[:4096])):
        return True
    pattern = SUPPORT.get(category)
    return bool(pattern and pattern.search(text[:4096]))
