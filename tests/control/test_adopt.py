"""Adopting a Ray job Argus did not submit (control/adopt.py): Ray's record and the supervisor actor's request
read back into the call that submits it again, and every bad answer from Ray a clear error."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from control.adopt import RaySubmission, _request, read_submission
from core.errors import InputError, NotFound, SourceUnavailable

RECORD = {"entrypoint": "cd /nfs/x && python3 -m verl.trainer.main_ppo a=b", "status": "FAILED",
          "metadata": {"owner": "ann", "argus_resubmit_of": "old", "argus_resubmit_root": "old",
                       "argus_resubmit_attempt": "1"},
          "runtime_env": {"working_dir": "gcs://_ray_pkg_0123.zip", "py_modules": ["gcs://_ray_pkg_m.zip", "/x"],
                          "env_vars": {"HF_HOME": "/nfs/hf"}}}


def answer(status: int, body: Any = None, text: str | None = None):  # type: ignore[no-untyped-def]
    def get(url: str, timeout: float) -> httpx.Response:
        if text is not None:
            return httpx.Response(status, text=text)
        return httpx.Response(status, json=body)
    return get


def supervisor(required: dict[str, float], selector: dict[str, str]):  # type: ignore[no-untyped-def]
    def list_actors(**kwargs: Any) -> list[dict[str, Any]]:
        assert kwargs["filters"] == [("name", "=", "_ray_internal_job_actor_job-1")]
        return [{"required_resources": required, "label_selector": selector}]
    return list_actors


def test_a_record_and_its_supervisor_become_the_call_that_runs_it_again() -> None:
    sub = read_submission("http://ray:8265", "job-1", get=answer(200, RECORD),
                          list_actors=supervisor({"CPU": 2, "GPU": 1, "memory": 1e9, "worker": 0.01},
                                                 {"argus.io/pool": "h100"}))
    assert sub.packages() == ["gcs://_ray_pkg_0123.zip", "gcs://_ray_pkg_m.zip"]
    call = sub.call("job-1-r1", entrypoint="new", env={"ARGUS_RESUME": "1"}, metadata={"argus_resubmit_of": "job-1"})
    assert call == {
        "entrypoint": "new", "submission_id": "job-1-r1",
        "runtime_env": {"working_dir": "gcs://_ray_pkg_0123.zip", "py_modules": ["gcs://_ray_pkg_m.zip", "/x"],
                        "env_vars": {"HF_HOME": "/nfs/hf", "ARGUS_RESUME": "1"}},
        # the old lineage is dropped, the new one given; the user's own metadata stays
        "metadata": {"owner": "ann", "argus_resubmit_of": "job-1"},
        "entrypoint_num_cpus": 2, "entrypoint_num_gpus": 1, "entrypoint_memory": 1000000000,
        "entrypoint_resources": {"worker": 0.01}, "entrypoint_label_selector": {"argus.io/pool": "h100"},
    }


def test_a_job_that_asked_for_nothing_is_not_pinned_to_a_head_by_its_old_id() -> None:
    assert _request({"required_resources": {}, "label_selector": {"ray.io/node-id": "abc"}}) == {}
    sub = read_submission("http://ray:8265", "job-1", get=answer(200, RECORD),
                          list_actors=supervisor({}, {"ray.io/node-id": "abc"}))
    call = sub.call("job-1-r1", entrypoint="x", env={}, metadata={})
    assert not {"entrypoint_num_cpus", "entrypoint_resources", "entrypoint_label_selector"} & set(call)
    assert sub.resources_known


def test_an_unknown_supervisor_leaves_the_request_unknown() -> None:
    sub = read_submission("http://ray:8265", "job-1", get=answer(200, RECORD), list_actors=lambda **_: [])
    assert not sub.resources_known


@pytest.mark.parametrize(("get", "error", "words"), [
    (answer(404, {"detail": "no"}), NotFound, "Ray has no job 'job-1'"),
    (answer(500, text="boom"), SourceUnavailable, "HTTP 500"),
    (answer(200, text="<html>"), SourceUnavailable, "not JSON"),
    (answer(200, ["a", "list"]), SourceUnavailable, "not a job record"),
    (answer(200, {"entrypoint": 7}), SourceUnavailable, "not a job record"),
])
def test_bad_answers_from_ray_are_clear_errors(get, error, words) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error) as caught:
        read_submission("http://ray:8265", "job-1", get=get, list_actors=lambda **_: [])
    assert words in str(caught.value)


def test_an_unreachable_dashboard_and_a_hostile_id_are_refused() -> None:
    def down(url: str, timeout: float) -> httpx.Response:
        raise httpx.ConnectError("refused")
    with pytest.raises(SourceUnavailable):
        read_submission("http://ray:8265", "job-1", get=down, list_actors=lambda **_: [])
    with pytest.raises(InputError):
        read_submission("http://ray:8265", "../../etc", get=down, list_actors=lambda **_: [])


def test_odd_runtime_envs_give_no_packages_and_keep_their_fields() -> None:
    odd = RaySubmission("j", "FAILED", "x", runtime_env={"working_dir": 5, "env_vars": ["not", "a", "dict"],
                                                         "pip": ["torch"]})
    assert odd.packages() == [] and odd.env == {}
    assert odd.call("j-r1", entrypoint="x", env={"A": "1"}, metadata={})["runtime_env"] == {
        "working_dir": 5, "pip": ["torch"], "env_vars": {"A": "1"}}
