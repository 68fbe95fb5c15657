"""JobRuns: which job is a resubmission of which, and whether it reached RUNNING (detectors/resubmissions.py),
with the id scheme and metadata of core.lineage."""

from __future__ import annotations

from core.lineage import Lineage, parse_resubmission_id, resubmission_id
from detectors.resubmissions import JobRuns
from tests.support.job_states import ARGUS, job_state, resubmission

SID = "grpo-20261122T084034Z-eff5"


def test_a_resubmission_named_by_its_metadata_counts_once_it_runs() -> None:
    runs = JobRuns()
    runs.observe([job_state(SID, "FAILED", metadata=ARGUS), resubmission(SID, 1, "PENDING")])
    assert runs.resubmission_ran(SID) is None  # submitted, not running yet
    runs.observe([job_state(SID, "FAILED", metadata=ARGUS), resubmission(SID, 1, "RUNNING")])
    assert runs.resubmission_ran(SID) == f"{SID}-r1"
    assert runs.status(f"{SID}-r1") == "RUNNING" and runs.status("never-seen") is None
    runs.observe([resubmission(SID, 1, "FAILED")])  # it ran, then failed: it still reached RUNNING
    assert runs.resubmission_ran(SID) == f"{SID}-r1"
    assert runs.resubmission_ran(f"{SID}-r1") is None  # no job resubmits itself


def test_a_resubmission_that_failed_before_running_or_only_finished_unseen() -> None:
    runs = JobRuns()
    runs.observe([resubmission(SID, 1, "FAILED")])  # a bad runtime env fails while PENDING: never ran
    assert runs.resubmission_ran(SID) is None
    runs.observe([resubmission("other", 1, "SUCCEEDED")])  # succeeded between two polls: it ran
    assert runs.resubmission_ran("other") == "other-r1"


def test_a_later_attempt_of_the_chain_resolves_every_earlier_one() -> None:
    runs = JobRuns()
    runs.observe([job_state(SID, "FAILED", metadata=ARGUS), resubmission(SID, 1, "FAILED"),
                  resubmission(f"{SID}-r1", 2, "RUNNING", root=SID)])
    assert runs.resubmission_ran(SID) == f"{SID}-r2"
    assert runs.resubmission_ran(f"{SID}-r1") == f"{SID}-r2"
    assert runs.resubmission_ran(f"{SID}-r2") is None


def test_jobs_anyone_submits_are_not_resubmissions_whatever_their_id_or_entrypoint() -> None:
    runs = JobRuns()
    # `ray job submit --submission-id <sid>-r1` of the same entrypoint: no Argus metadata, no link
    runs.observe([job_state(SID, "FAILED", metadata=ARGUS), job_state(f"{SID}-r1", "RUNNING")])
    assert runs.resubmission_ran(SID) is None
    # another Argus job, unrelated, RUNNING
    runs.observe([job_state("sft-20261122T090000Z-0a1b", "RUNNING", metadata=ARGUS)])
    assert runs.resubmission_ran(SID) is None
    # half-written lineage is not trusted; neither is a lineage on a job named for another chain
    half = {k: v for k, v in Lineage(of=SID, root=SID, attempt=1).metadata().items() if k != "argus_resubmit_root"}
    runs.observe([job_state("x-1", "RUNNING", metadata=half)])
    assert runs.resubmission_ran(SID) is None


def test_an_argus_resubmission_without_lineage_metadata_is_known_by_its_id() -> None:
    runs = JobRuns()
    runs.observe([job_state(SID, "FAILED", metadata=ARGUS), job_state(f"{SID}-r1", "RUNNING", metadata=ARGUS)])
    assert runs.resubmission_ran(SID) == f"{SID}-r1"
    # and an older attempt is no resubmission of a newer one
    runs.observe([job_state(f"{SID}-r2", "FAILED", metadata=ARGUS)])
    assert runs.resubmission_ran(f"{SID}-r2") is None


def test_long_roots_are_cut_in_the_id_but_told_apart_by_their_metadata() -> None:
    a, b = "x" * 56 + "-20261122T084034Z-aaaa", "x" * 56 + "-20261122T084034Z-bbbb"
    assert resubmission_id(a, 1) == resubmission_id(b, 1) == "x" * 56 + "-r1"
    assert parse_resubmission_id(resubmission_id(a, 3)) == ("x" * 56, 3)
    assert parse_resubmission_id(SID) is None and parse_resubmission_id("job-r0") is None
    runs = JobRuns()
    runs.observe([job_state(a, "FAILED", metadata=ARGUS), job_state(b, "FAILED", metadata=ARGUS),
                  resubmission(a, 1, "RUNNING")])
    assert runs.resubmission_ran(a) == resubmission_id(a, 1)
    assert runs.resubmission_ran(b) is None


def test_memory_is_bounded_and_forgotten_jobs_leave_no_trace() -> None:
    runs = JobRuns(max_jobs=3)
    runs.observe([resubmission(SID, 1, "RUNNING")])
    assert runs.resubmission_ran(SID) == f"{SID}-r1"
    runs.observe([job_state(f"other-{n}", "RUNNING") for n in range(3)])
    assert runs.status(f"{SID}-r1") is None and runs.resubmission_ran(SID) is None


def test_what_control_writes_on_a_resubmit_is_what_the_detectors_read(tmp_path) -> None:
    from control.jobs import JobController
    from control.jobspec import JobSpec

    controller = JobController("http://127.0.0.1:8265", tmp_path)  # submit_call builds the call; nothing is sent
    spec = JobSpec(name="grpo", workload="grpo", entrypoint="python train.py", owner="alice")
    root = "grpo-" + "z" * 60  # longer than the id keeps of it
    new = resubmission_id(root, 2)
    call = controller.submit_call(spec, new, tmp_path / new, lineage=Lineage(of=resubmission_id(root, 1), root=root,
                                                                            attempt=2))
    assert call["metadata"]["argus"] == "1" and call["metadata"]["argus_resubmit_attempt"] == "2"
    plain = controller.submit_call(spec, "grpo-1", tmp_path / "grpo-1")
    assert not any(k.startswith("argus_resubmit") for k in plain["metadata"])
    runs = JobRuns()
    runs.observe([job_state(root, "FAILED", metadata=ARGUS), job_state(new, "RUNNING", metadata=call["metadata"])])
    assert runs.resubmission_ran(root) == runs.resubmission_ran(resubmission_id(root, 1)) == new
