"""Waiting is visible on the real local cluster (tests/conftest.py `ray_cluster`: a 0-CPU head and two workers with
1 CPU and 4 GPUs each): a job asking for a resource no node has, and a running driver whose placement group no node
fits, are each a finding within pending_alert_s (3 s here) that names what it waits for and what is free; the
group's finding closes when its job is stopped.

A PENDING job Ray was asked to stop stays PENDING until a node takes it (control/jobs.py), so the test ends its own
PENDING job by killing its supervisor actor from a helper job; Ray then marks it FAILED, which closes its wait too.
"""

from __future__ import annotations

import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from ray.job_submission import JobSubmissionClient

from collectors.ray_state import SUPERVISOR_PREFIX, RayStateCollector
from core.types import Category, Finding, Recovery, Severity
from detectors.waiting import WaitingJobDetector
from tests.helpers import wait_until

ALERT_S = 3.0
PG_DRIVER = textwrap.dedent("""\
    import time
    import ray
    from ray.util.placement_group import placement_group
    ray.init()
    group = placement_group([{"CPU": 1000}, {"CPU": 1000}], strategy="SPREAD", name="too-big")
    print("ASKED", group.id.hex(), flush=True)
    time.sleep(600)
""")
KILL_SUPERVISOR = textwrap.dedent("""\
    import sys
    import ray
    ray.init()
    ray.kill(ray.get_actor(sys.argv[1], namespace="SUPERVISOR_ACTOR_RAY_NAMESPACE"), no_restart=True)
    print("KILLED", sys.argv[1], flush=True)
""")
ON_A_WORKER = {"worker": 0.001}  # as JobController submits: the driver runs on a worker, not the 0-CPU head


@pytest.mark.ray
def test_a_job_waiting_for_a_place_is_a_finding_that_closes_when_the_wait_ends(ray_cluster, tmp_path: Path) -> None:
    client = JobSubmissionClient(ray_cluster.dashboard_url)
    collector = RayStateCollector(ray_cluster.dashboard_url, timeout_s=10)
    detector = WaitingJobDetector(alert_s=ALERT_S)
    tag = uuid.uuid4().hex[:6]
    (tmp_path / "pg_driver.py").write_text(PG_DRIVER)
    (tmp_path / "kill_supervisor.py").write_text(KILL_SUPERVISOR)
    found: dict[str, tuple[Finding, float]] = {}
    recovered: dict[str, Recovery] = {}
    submitted: list[str] = []

    def poll() -> None:
        for finding in detector.detect(collector.collect()):
            found.setdefault(finding.subject.id, (finding, time.monotonic() - start))
        recovered.update((r.fingerprint, r) for r in detector.recoveries())

    groups = client.submit_job(entrypoint=f"{sys.executable} {tmp_path / 'pg_driver.py'}",
                               submission_id=f"waits-pg-{tag}", entrypoint_resources=ON_A_WORKER)
    submitted.append(groups)
    # the driver must be RUNNING with its group asked before the clock starts: on a loaded host its own start can
    # take longer than pending_alert_s, and a driver not yet started is (rightly) a PENDING job's finding
    try:
        wait_until("the placement-group driver to ask for its group",
                   lambda: any(s.subject.id == groups and s.attrs.get("waiting_groups")
                               for s in collector.collect()), timeout=90)
    except BaseException:
        client.stop_job(groups)
        raise
    start = time.monotonic()
    pending = client.submit_job(entrypoint="echo never", submission_id=f"waits-res-{tag}",
                                entrypoint_resources={"no_such_thing": 1})
    submitted.append(pending)
    try:
        wait_until("a finding for each waiting job", lambda: poll() or {pending, groups} <= set(found), timeout=45)
        (resources, resources_s), (placement, placement_s) = found[pending], found[groups]
        print(f"\nsubmit -> finding: PENDING job {resources_s:.1f} s, placement group {placement_s:.1f} s "
              f"(pending_alert_s={ALERT_S:g})\n{resources.summary}\n{placement.summary}")

        # (a) the driver waits for a resource no node has; the cluster's free CPUs and GPUs are named
        assert (resources.category, resources.severity, resources.reason) == (
            Category.UNSCHEDULABLE, Severity.WARNING, "JobPendingTooLong")
        assert "no node offered resources no_such_thing=1" in resources.summary
        assert "no alive node has no_such_thing" in resources.summary
        assert "2 alive nodes with GPU: 4/4 free" in resources.summary, resources.summary
        assert resources.attrs["label_selector"] == {}  # read from its supervisor actor: resources, no labels

        # (b) a RUNNING driver's group no node fits: its bundles and the CPUs the nodes have free
        assert placement.reason == "PlacementGroupsUnplaced"
        assert "2 bundles of {CPU: 1000}" in placement.summary and "group too-big (PENDING" in placement.summary
        assert "2 alive nodes with CPU: " in placement.summary, placement.summary
        # its strategy comes from Ray's autoscaler report, which lists the group from its next round (every 5 s)
        def strategy() -> str | None:
            [job] = [s for s in collector.collect() if s.subject.id == groups]
            return next((g["strategy"] for g in job.attrs["waiting_groups"] or [] if g["strategy"]), None)

        assert wait_until("the group's strategy in the autoscaler report", strategy, timeout=20) == "SPREAD"

        # once per wait: more polls find nothing new
        before = dict(found)
        for _ in range(3):
            poll()
        assert found == before and not recovered

        # (c) the stopped job's wait ends: its finding closes
        assert client.stop_job(groups)
        wait_until("the placement group finding to close", lambda: poll() or placement.fingerprint in recovered,
                   timeout=30)
        # Ray removes a stopped job's groups a moment before it marks the job STOPPED: either may be seen first
        reason = recovered[placement.fingerprint].reason
        assert reason.startswith((f"job {groups} removed the placement group it waited on",
                                  f"job {groups} ended (STOPPED)")), reason
        print(f"closed: {reason}")

        # the PENDING job ends only once its supervisor is gone: it FAILS, and its finding closes too
        killer = client.submit_job(entrypoint=f"{sys.executable} {tmp_path / 'kill_supervisor.py'} "
                                              f"{SUPERVISOR_PREFIX}{pending}",
                                   submission_id=f"waits-kill-{tag}", entrypoint_resources=ON_A_WORKER)
        submitted.append(killer)
        wait_until("the PENDING job's finding to close", lambda: poll() or resources.fingerprint in recovered,
                   timeout=40)
        assert f"job {pending} ended (FAILED)" in recovered[resources.fingerprint].reason
        print(f"closed: {recovered[resources.fingerprint].reason}")
    finally:
        for sid in submitted:
            try:
                if not client.get_job_status(sid).is_terminal():
                    client.stop_job(sid)
            except RuntimeError:
                pass
