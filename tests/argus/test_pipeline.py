"""The loop's own rules: a failing source is reported and the rest carry on; a detector that needs a
source which failed this tick skips the tick instead of judging from missing data."""


from argus.incidents.desk import IncidentDesk
from argus.pipeline import Pipeline
from core.errors import SourceUnavailable
from core.types import Signal, SignalKind, Subject, SubjectKind


class Source:
    def __init__(self, name: str):
        self.name, self.down = name, False

    def collect(self):
        if self.down:
            raise SourceUnavailable(self.name, "http://10.0.0.1:8265", "connection refused")
        return [Signal(kind=SignalKind.NODE_STATE, source=self.name, subject=Subject(kind=SubjectKind.NODE, id="n"))]


class Counting:
    def __init__(self, name: str):
        self.name, self.calls = name, 0

    def detect(self, signals):
        self.calls += 1
        return []


class Broken:
    name = "broken"

    def detect(self, signals):
        raise RuntimeError("bug in a detector")


def test_detector_skips_ticks_when_a_source_it_needs_is_down(store):
    logs, state = Source("ray_logs"), Source("ray_state")
    stall, other = Counting("stall"), Counting("lost_node")
    pipeline = Pipeline(collectors=[logs, state], detectors=[stall, other, Broken()],
                        incidents=IncidentDesk(store),
                        needs={"stall": {"ray_logs"}})
    first = pipeline.run_once()
    assert stall.calls == 1 and other.calls == 1 and "detector:broken" in first.errors
    logs.down = True
    result = pipeline.run_once()
    assert stall.calls == 1 and other.calls == 2
    assert "ray_logs" in result.errors and result.signals == 1
    health = {s["name"]: s for s in pipeline.health()["sources"]}
    assert health["ray_logs"]["ok"] is False and "connection refused" in health["ray_logs"]["last_error"]
    assert health["ray_state"]["ok"] is True
    logs.down = False
    pipeline.run_once()
    assert stall.calls == 2
