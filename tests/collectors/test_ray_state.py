"""RayStateCollector's conversion of Ray's state records, with the records given as Ray 2.60 returns
them (dicts standing in for the state API; the real API is exercised in tests/argus/test_lost_node_e2e.py)."""

from collectors.ray_state import RayStateCollector
from core.types import SignalKind

NODE = "a" * 56


class State:
    def __init__(self, jobs, actors=(), node_state="ALIVE"):
        self.jobs, self.actors, self.node_state = list(jobs), list(actors), node_state

    def list_nodes(self, **_):
        return [{"node_id": NODE, "node_ip": "10.0.0.3", "state": self.node_state, "is_head_node": False,
                 "state_message": None, "resources_total": {"GPU": 8}, "labels": {}, "start_time_ms": 1,
                 "end_time_ms": 0}]

    def list_jobs(self, **_):
        return self.jobs

    def list_actors(self, filters=None, **_):
        return self.actors


def test_a_job_that_never_called_ray_init_is_still_a_job():
    """A submitted entrypoint that is not a Ray driver has no Ray job id, only its submission id."""
    state = State([{"job_id": None, "submission_id": "sft-42", "status": "RUNNING", "entrypoint": "torchrun sft.py",
                    "start_time": 1_795_316_840_376, "metadata": {"owner": "alice"}}])
    signals = RayStateCollector("http://head:8265", state_api=state).collect()
    [job] = [s for s in signals if s.kind is SignalKind.JOB_STATE]
    assert job.subject.id == "sft-42" and job.attrs["status"] == "RUNNING"
    assert job.attrs["start_time"].startswith("2026-") and job.attrs["metadata"] == {"owner": "alice"}


def test_jobs_on_a_node_are_remembered_after_it_dies():
    state = State(
        [{"job_id": "03000000", "submission_id": "ppo-7", "status": "RUNNING", "entrypoint": "python ppo.py"}],
        actors=[{"actor_id": "x", "job_id": "03000000", "node_id": NODE, "state": "ALIVE"}],
    )
    collector = RayStateCollector("http://head:8265", state_api=state)
    collector.collect()
    state.node_state, state.actors = "DEAD", []
    [node] = [s for s in collector.collect() if s.kind is SignalKind.NODE_STATE]
    assert node.attrs["state"] == "DEAD" and [j["submission_id"] for j in node.attrs["jobs"]] == ["ppo-7"]
