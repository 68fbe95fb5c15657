"""W&B with the real wandb package, offline, on the session's Ray cluster: a job submitted with `wandb:` logs its
steps, and the run lands in its job folder under its submission id; Argus's job record names the project."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from control.jobs import JobController
from control.jobspec import JobSpec
from tests.helpers import wait_until

pytest.importorskip("wandb", reason="the W&B test needs the wandb package: pip install -e .[dev]")
pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

TRAINER = textwrap.dedent("""
    import os, wandb
    run = wandb.init()  # everything from the environment Argus set
    print("WANDB_RUN=" + run.id + " PROJECT=" + run.project + " GROUP=" + str(run.group), flush=True)
    for step in range(1, 6):
        run.log({"loss": 1.0 / step}, step=step)
    run.finish()
    print("DONE", flush=True)
""")


def test_a_job_with_wandb_logs_an_offline_run_into_its_folder(ray_cluster, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    code = shared / "code"
    code.mkdir(parents=True)
    (code / "train.py").write_text(TRAINER)
    jobs = JobController(ray_cluster.dashboard_url, shared, code_roots=[shared])
    spec = JobSpec.from_dict({"name": "wandb-sft", "owner": "alice", "entrypoint": f"{sys.executable} train.py",
                              "code_path": str(code), "working_dir": str(code), "wandb": {"project": "argus-tests"},
                              "env": {"WANDB_SILENT": "true"}})
    sid = jobs.submit(spec).submission_id
    try:
        record = wait_until("the job to end", lambda: (r := jobs.get(sid)).ended and r, timeout=240, interval=1)
        log = jobs.logs(sid)
        assert record.status == "SUCCEEDED", log[-2000:]
        assert f"WANDB_RUN={sid} PROJECT=argus-tests GROUP={sid}" in log and "DONE" in log
        [run_dir] = list((jobs.job_dir(sid) / "wandb").glob(f"offline-run-*-{sid}"))
        assert (run_dir / f"run-{sid}.wandb").stat().st_size > 0  # the run's data, ready for `wandb sync`
        assert record.wandb_project == "argus-tests" and record.wandb_url is None  # offline: no URL yet
    finally:
        if not jobs.get(sid).ended:
            jobs.stop(sid, reason="test done")
