"""A hang confirmed from stacks long before silence alone would call it, and a silent 50 s checkpoint save that is
no hang, on real jobs.

Real: the Ray cluster (session fixture), two gloo jobs submitted through the Jobs API (stage/localstack/jobs/
gloo_steps.py): a 4-rank job whose rank 1 blocks on a lock after step 8 (steps enough for its rhythm to be
known), and a 2-rank job whose rank 1 saves a checkpoint with torch.save for 50 s, printing nothing (its process
often in state D, writing), while rank 0 waits in a barrier, then trains on to the end.
Argus's loop over them is real but for the log collector: job states from Ray (RayStateCollector), the stack
sampler (RankStackSampler: py-spy through Ray's dashboard, process states from /proc) and the stall detector. The
driver logs are tailed here into LOG_LINE signals (tests/faults/test_stall_real.py), as there.
Tuned: the suspicion floor is 5 s (production 20 s) and the silence threshold 20 s (production 60 s), so that the
save outlasts the silence threshold more than twice over: only its stacks keep it from being called a hang
(50 s, not 90 s: the longer save added 40 s to the test and proved nothing more).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

import pytest

from collectors.rank_stacks import RankStackSampler
from collectors.ray_state import RayStateCollector
from core.types import Finding, SignalKind
from detectors.stall import StallDetector
from stage.localstack.jobs import JOBS_DIR
from stage.localstack.ray_cluster import RayCluster
from tests.faults.test_stall_real import DriverLogTail, stop_all

pytest.importorskip("torch", reason="the hang tests need torch==2.13.0 (CPU build): pip install -e .[dev]")

pytestmark = [pytest.mark.ray, pytest.mark.timeout(480)]

SCRIPT = JOBS_DIR / "gloo_steps.py"
SAVE_S = 50


def submit(cluster: RayCluster, name: str, *args: str) -> tuple[object, str]:
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(cluster.dashboard_url)
    sid = f"argus-{name}-{uuid.uuid4().hex[:8]}"
    client.submit_job(entrypoint=" ".join([sys.executable, str(SCRIPT), *args]), submission_id=sid,
                      metadata={"test": "hang-confirm"})
    return client, sid


def test_stacks_confirm_a_hang_at_once_and_hold_a_silent_save_back(ray_cluster: RayCluster, tmp_path: Path) -> None:
    ranks_file = tmp_path / "ranks.json"
    common = ["--interval-start", "0.3", "--interval-end", "0.3", "--timeout", "600"]
    hung_client, hung = submit(ray_cluster, "hang-lock", "--world", "4", "--fault", "lock", "--fault-rank", "1",
                               "--stall-after", "8", "--steps", "100000", "--ranks-file", str(ranks_file), *common)
    save_client, saving = submit(ray_cluster, "save", "--world", "2", "--fault", "save", "--fault-rank", "1",
                                 "--save-s", str(SAVE_S), "--stall-after", "4", "--steps", "8", *common)
    detector = StallDetector(min_stall_s=20, factor=3, suspect_min_s=5)
    sampler = RankStackSampler(ray_cluster.dashboard_url, detector.stack_requests, timeout_s=20)
    states = RayStateCollector(ray_cluster.dashboard_url, timeout_s=10)
    tails = {hung: DriverLogTail(ray_cluster, hung), saving: DriverLogTail(ray_cluster, saving)}
    status: dict[str, str] = {}
    found: dict[str, list[Finding]] = {hung: [], saving: []}
    last_step_at: dict[str, float] = {}
    verdicts: list[str] = []
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            signals = states.collect() + sampler.collect()
            for sid, tail in tails.items():
                new = tail.poll()
                if any(" loss=" in (s.text or "") for s in new):
                    last_step_at[sid] = time.monotonic()
                signals += new
            for s in signals:
                if s.kind is SignalKind.JOB_STATE and s.subject.id in tails:
                    status[s.subject.id] = str(s.attrs.get("status"))
                if s.kind is SignalKind.STACKS:
                    verdicts.append(s.subject.id)
            for finding in detector.detect(signals):
                if finding.subject.id in found:
                    if not found[finding.subject.id]:
                        after = time.monotonic() - last_step_at[finding.subject.id]
                        print(f"{finding.subject.id}: hang called {after:.1f} s after its last step, by "
                              f"{finding.attrs['confirmed_by']}: {finding.summary}")
                    found[finding.subject.id].append(finding)
            if found[hung] and status.get(saving) in {"SUCCEEDED", "FAILED", "STOPPED"}:
                break
            time.sleep(0.5)
        said = {sid: tails[sid].lines[-8:] for sid in tails}
        assert status.get(saving) == "SUCCEEDED", f"the saving job did not finish: {status}; {said}"
        assert any("step 8 " in line for line in tails[saving].lines)
        assert found[saving] == [], f"a silent save was called a hang: {found[saving][0].summary}"
        assert saving in verdicts, "the saving job was never suspected and sampled: the test proves nothing"

        assert found[hung], f"the lock hang was never called: {said[hung]}"
        first = found[hung][0]
        assert first.attrs["confirmed_by"] == "stacks", first.summary
        assert first.attrs["stalled_s"] < 20, "confirmed only when silence alone would have called it"
        ranks = json.loads(ranks_file.read_text())["ranks"]
        [culprit] = first.attrs["localization"]["culprits"]
        assert culprit["pid"] == ranks[1]["pid"] and culprit["node"] == ranks[1]["node"], first.attrs["localization"]
        assert "is blocked outside the collective, in wait_on_lock (gloo_steps.py:" in first.summary
        assert sorted(w["pid"] for w in first.attrs["localization"]["waiting"]) == sorted(
            r["pid"] for r in ranks if r["rank"] != 1)
        assert any(e.source == "py-spy" and f"pid {ranks[1]['pid']}" in e.text for e in first.evidence)
    finally:
        sampler.close()
        stop_all([(hung_client, hung), (save_client, saving)])
