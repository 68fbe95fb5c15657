"""Jobs submitted with plain `ray job submit` (no Argus spec), on the real local cluster: Argus adopts them from
Ray's own record, keeps their scene and resubmits them, and the new run starts at the last checkpoint's step,
as the trainer prints it.

- A trainer with verl's command line and checkpoint layout (stage/localstack/jobs/hydra_trainer.py), its output
  piped into `tee` as verl's example scripts do, loses its node: lost-node incident, scene, drain, resubmit with
  `trainer.resume_mode=resume_path trainer.resume_from_path=<global_step_N>` inserted before the pipe.
- A trainer that takes `--resume PATH` (declared with `--metadata-json '{"argus_resume_flag": "--resume"}'`)
  hangs: the resubmit step stops it and starts it again from its newest checkpoint.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from core.errors import NotFound
from core.types import ActionState, Category, Subject, SubjectKind
from remediation.actions import keep_scene, resubmit_job
from remediation.policy import Mode
from stage.localstack.jobs import JOBS_DIR
from tests.helpers import wait_until
from tests.remediation.test_remediation_real import Env
from tests.support import make_incident

pytestmark = [pytest.mark.ray]

RAY = str(Path(sys.executable).parent / "ray")


def ray_job_submit(cluster, sid: str, words: list[str], metadata: dict[str, str] | None = None) -> str:  # type: ignore[no-untyped-def]
    """`ray job submit ... -- <words>`, as a user types it: no Argus spec, no Argus folder. The CLI quotes each
    word (`&&` and `|` too), so a pipeline is given as `bash -c '<script>'`. Returns the entrypoint Ray got."""
    argv = [RAY, "job", "submit", "--address", cluster.dashboard_url, "--submission-id", sid, "--no-wait"]
    if metadata:
        argv += ["--metadata-json", json.dumps(metadata)]
    done = subprocess.run([*argv, "--", *words], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    return shlex.join(words)


def ray_record(cluster, sid: str) -> dict:  # type: ignore[no-untyped-def,type-arg]
    return httpx.get(f"{cluster.dashboard_url}/api/jobs/{sid}", timeout=10).json()


def printed(env: Env, sid: str, prefix: str) -> str:
    """The first line of the job's driver log starting with `prefix`, once it is there."""
    def found() -> str | None:
        try:
            log = env.jobs.logs(sid)
        except Exception:  # noqa: BLE001 - no driver yet
            return None
        return next((line for line in log.splitlines() if line.startswith(prefix)), None)

    try:
        return wait_until(f"job {sid} to print {prefix}", found, timeout=120)
    except AssertionError:
        record = ray_record(env.cluster, sid)
        try:
            log = env.jobs.logs(sid)[-3000:]
        except Exception as exc:  # noqa: BLE001 - the log is what is missing
            log = repr(exc)
        raise AssertionError(f"job {sid} never printed {prefix}: {record.get('status')} {record.get('message')}\n"
                             f"{log}") from None


def stop(env: Env, *sids: str) -> None:
    """Stop the test's jobs and wait until Ray has ended them: the next test's lost node must not name them."""
    for sid in sids:
        try:
            env.jobs.client.stop_job(sid)
        except Exception:  # noqa: BLE001 - never submitted, or ended
            pass

    def ended() -> bool:
        try:
            return all(env.jobs.get(s).ended for s in sids)
        except NotFound:
            return True

    try:
        wait_until("the test's jobs to end", ended, timeout=60)
    finally:
        env.store.close()


def test_a_ray_job_submit_job_that_loses_its_node_resumes_from_its_checkpoint_through_a_pipe(
        ray_cluster, ray_faults, tmp_path: Path) -> None:
    env = Env(ray_cluster, tmp_path, Mode.AUTO)
    code = env.shared / "code"
    shutil.copy(JOBS_DIR / "hydra_trainer.py", code)
    ckpt = env.shared / "ckpt" / "run1"
    sid = "verl-grpo-plain"
    script = (f"cd {code} && {sys.executable} hydra_trainer.py data.train_files={env.shared}/train.parquet "
              f"actor_rollout_ref.model.path={env.shared}/model trainer.project_name=stage "
              f"trainer.experiment_name=run1 trainer.default_local_dir={ckpt} trainer.save_freq=3 "
              f"2>&1 | tee {env.shared}/train.log")
    try:
        entry = ray_job_submit(ray_cluster, sid, ["bash", "-c", script])
        assert printed(env, sid, "RESUMED_AT_STEP=") == "RESUMED_AT_STEP=0"
        rank_node = printed(env, sid, "RANK_NODE=").split("=", 1)[1]
        wait_until("a whole checkpoint", lambda: (ckpt / "latest_checkpointed_iteration.txt").exists(), timeout=60)
        env.pipeline.run_once()  # Argus sees the node ALIVE with the job's rank on it
        ray_faults.kill_worker(env.worker_index(rank_node))
        incident = env.lost_node_incident()
        assert sid in [j.get("submission_id") for j in incident.attrs["jobs"]]
        env.remediator.plan(incident)
        try:
            actions = env.run_until_settled(incident.id)
        except AssertionError:
            states = [(a.kind, a.state.value, a.result) for a in env.store.list_actions(incident.id)]
            raise AssertionError(f"the plan did not finish: {states}") from None
        by_kind = {a.kind: a for a in actions}
        assert all(a.state is ActionState.SUCCEEDED for a in actions), [
            (a.kind, a.state.value, a.result.get("message")) for a in actions]
        # Ended: by the resubmission when the driver was still waiting on its dead rank, else with tee's status
        # (SUCCEEDED though the trainer died) or the trainer's.
        assert env.jobs.get(sid).status in ("STOPPED", "SUCCEEDED", "FAILED")

        # the node's incident names every job with work there (another test's may still be ending): this one's
        scene = env.shared / "jobs" / sid / "scene" / incident.id
        assert str(scene) in by_kind["keep_scene"].result["folders"]
        files = set(json.loads((scene / "manifest.json").read_text())["files"])
        assert {"config/ray_submission.json", "ray/actors.json", "ray/job.json", "logs/driver-tail.log"} <= files
        kept = json.loads((scene / "config" / "ray_submission.json").read_text())
        assert kept["entrypoint"] == entry and kept["resources_known"] is True
        assert "RANK_NODE=" in (scene / "logs" / "driver-tail.log").read_text()

        last = int((ckpt / "latest_checkpointed_iteration.txt").read_text())
        [mine] = [j for j in by_kind["resubmit_job"].result["jobs"] if j["job"] == sid]
        assert (mine["state"], mine["new"], mine["how"], mine["step"], mine["adopted"]) == (
            "submitted", f"{sid}-r1", "verl", last, True)
        new_sid = f"{sid}-r1"
        assert printed(env, new_sid, "RESUMED_AT_STEP=") == f"RESUMED_AT_STEP={last}"
        assert printed(env, new_sid, "step:").startswith(f"step:{last + 1} ")
        new_entry = shlex.split(ray_record(ray_cluster, new_sid)["entrypoint"])
        assert new_entry[:2] == ["bash", "-c"] and len(new_entry) == 3
        assert new_entry[2] == script.replace(" 2>&1 | tee", f" trainer.resume_mode=resume_path "
                                              f"trainer.resume_from_path={ckpt}/global_step_{last} 2>&1 | tee")
        assert printed(env, new_sid, "RANK_NODE=") != f"RANK_NODE={rank_node}"
    finally:
        stop(env, sid, f"{sid}-r1")


def test_a_hung_ray_job_submit_job_with_a_resume_flag_is_stopped_and_resumed(ray_cluster, tmp_path: Path) -> None:
    env = Env(ray_cluster, tmp_path, Mode.AUTO)
    code = env.shared / "code"
    shutil.copy(JOBS_DIR / "flag_trainer.py", code)
    ckpts = env.shared / "ckpt" / "flag"
    sid = "flag-trainer-plain"
    words = [sys.executable, str(code / "flag_trainer.py"), "--ckpt-dir", str(ckpts), "--save-every", "4"]
    try:
        entry = ray_job_submit(ray_cluster, sid, words, metadata={"argus_resume_flag": "--resume", "owner": "bob"})
        printed(env, sid, "RANK_NODE=")
        wait_until("two checkpoints", lambda: len(list(ckpts.glob("step_*.ckpt"))) >= 2, timeout=60)
        hang = make_incident(id="inc-0123456789ab", category=Category.NCCL_HANG,
                             subject=Subject(kind=SubjectKind.JOB, id=sid), summary="no step for 300 s",
                             reason="stalled")
        kept = keep_scene(env.ctx, hang, {}, dry_run=False)
        assert kept.state is ActionState.SUCCEEDED, kept.message
        scene = env.shared / "jobs" / sid / "scene" / hang.id
        files = json.loads((scene / "manifest.json").read_text())["files"]
        assert {"config/ray_submission.json", "ray/actors.json", "logs/driver-tail.log"} <= set(files)
        # py-spy is in the venv and the session cluster allows profiling: the stacks of the driver and its rank
        stacks = [f for f in files if f.startswith("stacks/")]
        problems = json.loads((scene / "manifest.json").read_text())["problems"]
        assert any(f.startswith("stacks/driver-") for f in stacks), problems
        assert any(f.startswith("stacks/Rank-") for f in stacks), problems
        assert "flag_trainer.py" in (scene / next(f for f in stacks if f.startswith("stacks/driver-"))).read_text()
        outcome = resubmit_job(env.ctx, hang, {}, dry_run=False)
        assert outcome.state is ActionState.SUCCEEDED, outcome.message
        [mine] = outcome.data["jobs"]
        assert env.jobs.get(sid).status == "STOPPED"
        step = mine["step"]
        assert mine["how"] == "flag" and step >= 8 and f"step_{step}.ckpt" in outcome.message
        new_sid = f"{sid}-r1"
        assert printed(env, new_sid, "RESUMED_AT_STEP=") == f"RESUMED_AT_STEP={step}"
        record = ray_record(ray_cluster, new_sid)
        assert record["entrypoint"] == f"{entry} --resume {ckpts}/step_{step}.ckpt"
        assert record["metadata"]["owner"] == "bob"
        assert record["metadata"]["argus_resubmit_of"] == sid
        assert record["runtime_env"]["env_vars"]["ARGUS_RESUME_FROM"] == f"{ckpts}/step_{step}.ckpt"
        # Done once: a second run of the step finds the resubmission there and starts nothing.
        again = resubmit_job(env.ctx, hang, {}, dry_run=False)
        assert [j["state"] for j in again.data["jobs"]] == ["exists"]
    finally:
        stop(env, sid, f"{sid}-r1")
