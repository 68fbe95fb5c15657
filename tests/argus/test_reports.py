"""The report service over a real SQLite store and a job folder: it reads the job's logs and spec, stores
the report, writes it next to the job, serves it over the API, and keeps going after a bad incident."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from argus.api.app import create_app
from argus.notify.webhook import incident_payload
from argus.reports import ReportService
from argus.store.store import Store
from core.settings import load_settings
from core.types import Action, ActionState, Category, Evidence, Finding, Severity, Subject, SubjectKind
from detectors.engine import load_rules
from rca.engine import RcaEngine
from rca.redact import Redactor
from tests.helpers import wait_until

SID = "sft-20260501T120000Z-ab12"
SECRET = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"


@pytest.fixture
def store(tmp_path: Path):
    s = Store(f"sqlite:///{tmp_path / 'argus.db'}")
    yield s
    s.close()


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    job = tmp_path / "shared" / "jobs" / SID
    for sub in ("config", "logs", "checkpoints/global_step_40"):
        (job / sub).mkdir(parents=True)
    (job / "config" / "jobspec.yaml").write_text(
        "name: sft\nentrypoint: python train.py\nnnodes: 1\ngpus_per_node: 8\nowner: alice\n"
        f"env: {{HF_TOKEN: {SECRET}}}\n")
    (job / "logs" / "driver.log").write_text(
        "2026-05-01 11:59:00,000 INFO step:41 - loss:0.3\n"
        f"2026-05-01 11:59:01,000 INFO logged in with token {SECRET}\n"
        "2026-05-01 11:59:58,000 ERROR torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    return tmp_path / "shared"


def open_incident(store: Store) -> str:
    finding = Finding(category=Category.UNKNOWN, reason="JobFailed", subject=Subject(kind=SubjectKind.JOB, id=SID),
                      summary=f"job {SID} failed", severity=Severity.CRITICAL,
                      evidence=(Evidence(source="ray.jobs", text="status=FAILED"),),
                      first_seen=datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc), attrs={"submission_id": SID})
    incident, _ = store.record_finding(finding)
    return incident.id


def service(store: Store, shared: Path) -> ReportService:
    return ReportService(store, RcaEngine(load_rules([]), Redactor), shared)


def test_a_report_is_stored_written_next_to_the_job_and_served(store: Store, shared: Path) -> None:
    incident_id = open_incident(store)
    [report] = service(store, shared).write(incident_id)
    assert report.category is Category.GPU_OOM and report.id.startswith("rep")
    written = shared / "jobs" / SID / "rca" / f"{incident_id}.md"
    assert written.read_text() == report.markdown
    assert (shared / "jobs" / SID / "rca" / f"{incident_id}.json").is_file()
    assert SECRET not in report.markdown and SECRET not in written.read_text()
    assert "owner alice" in report.markdown and report.data["impact"]["gpus"] == 8

    _, token = store.create_token("reader", "viewer", created_by="tests")
    api = TestClient(create_app(store=store), headers={"Authorization": f"Bearer {token}"})
    as_json = api.get(f"/v1/incidents/{incident_id}/report")
    assert as_json.status_code == 200 and as_json.json()["category"] == "gpu_oom"
    as_md = api.get(f"/v1/incidents/{incident_id}/report", headers={"Accept": "text/markdown"})
    assert as_md.headers["content-type"].startswith("text/markdown") and as_md.text == report.markdown
    assert api.get(f"/v1/incidents/{incident_id}/report", params={"format": "markdown"}).text == report.markdown
    assert api.get(f"/v1/incidents/{incident_id}/report", params={"format": "pdf"}).status_code == 422
    assert api.get("/v1/incidents/inc-000000000000/report").status_code == 404
    assert api.get(f"/v1/incidents/{'x' * 100}/report").status_code == 422  # the id's documented pattern
    assert TestClient(create_app(store=store)).get(f"/v1/incidents/{incident_id}/report").status_code == 401


def test_an_incident_without_a_report_yet_is_404_with_a_hint(store: Store) -> None:
    incident_id = open_incident(store)
    _, token = store.create_token("reader", "viewer", created_by="tests")
    api = TestClient(create_app(store=store), headers={"Authorization": f"Bearer {token}"})
    response = api.get(f"/v1/incidents/{incident_id}/report")
    assert response.status_code == 404 and "retry" in response.json()["hint"]


def test_the_worker_writes_queued_reports_and_survives_a_bad_one(store: Store, shared: Path) -> None:
    reports = service(store, shared)
    reports.start()
    try:
        reports.submit("inc-doesnotexist")  # fails inside the worker, logged
        good = open_incident(store)
        reports.submit(good)
        reports.submit(good)  # queued once
        wait_until("the report to be written", lambda: store.reports_for(good) and reports.idle(), timeout=30)
        assert len(store.reports_for(good)) == 1
    finally:
        reports.stop()


def test_open_incidents_left_without_a_report_by_a_killed_argus_get_one_at_start(store: Store, shared: Path) -> None:
    missing = open_incident(store)  # opened, then the process died before its report was stored
    resolved = store.record_finding(Finding(
        category=Category.DISK_FULL, reason="NoSpaceLeftOnDevice", subject=Subject(kind=SubjectKind.JOB, id="other"),
        summary="disk full", first_seen=datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)))[0]
    store.set_state(resolved.id, "resolved", by="test", reason="fixed")
    reports = service(store, shared)
    reports.start()
    try:
        assert reports.catch_up() == [missing]  # a resolved incident is left alone
        wait_until("the missing report", lambda: store.reports_for(missing) and reports.idle(), timeout=30)
        assert reports.catch_up() == []  # written once: nothing to catch up the next time
    finally:
        reports.stop()


def test_without_a_job_folder_the_report_still_comes(store: Store, tmp_path: Path) -> None:
    incident_id = open_incident(store)
    [report] = service(store, tmp_path / "nowhere").write(incident_id)
    assert report.category is Category.UNKNOWN and "## Summary" in report.markdown


def test_notifications_link_the_report(store: Store) -> None:
    incident = store.get_incident(open_incident(store))
    body = incident_payload(incident, "opened", link=f"http://argus:8600/v1/incidents/{incident.id}")
    assert body["report"] == f"http://argus:8600/v1/incidents/{incident.id}/report"


def test_llm_settings_are_validated() -> None:
    settings = load_settings(None, llm_base_url="http://127.0.0.1:8080/v1/", llm_api_key="s3cret")
    assert settings.llm_base_url == "http://127.0.0.1:8080/v1"
    assert "s3cret" not in settings.model_dump_json()
    with pytest.raises(Exception, match="llm_method"):
        load_settings(None, llm_method="telepathy")


def test_a_slow_llm_pass_does_not_hold_up_the_next_incidents_first_report(store: Store, shared: Path) -> None:
    """The LLM takes a minute per report on a CPU; a new incident's deterministic report must come at once."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from rca.llm import LlmWriter

    release = threading.Event()

    class Stuck(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            self.rfile.read(int(self.headers.get("content-length") or 0))
            release.wait(30)
            self.send_response(503)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:  # type: ignore[no-untyped-def]
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Stuck)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    writer = LlmWriter(f"http://127.0.0.1:{server.server_address[1]}/v1", "m", timeout_s=30, max_retries=0)
    reports = ReportService(store, RcaEngine(load_rules([]), Redactor, writer=writer), shared)
    reports.start()
    try:
        first = open_incident(store)
        reports.submit(first)
        wait_until("the first incident's deterministic report", lambda: store.reports_for(first), timeout=30)
        second_finding = Finding(category=Category.GPU_OOM, reason="CudaOom", summary="CUDA out of memory",
                                 subject=Subject(kind=SubjectKind.JOB, id="rl-20260501T120000Z-cd34"),
                                 severity=Severity.CRITICAL, evidence=(Evidence(source="log", text="CUDA oom"),),
                                 first_seen=datetime(2026, 5, 1, 12, 1, tzinfo=timezone.utc))
        second, _ = store.record_finding(second_finding)
        reports.submit(second.id)
        # the LLM pass of the first incident is still stuck in the server while the second's report is written
        wait_until("the second incident's deterministic report", lambda: store.reports_for(second.id), timeout=20)
        assert not release.is_set() and len(store.reports_for(first)) == 1 and not reports.idle()
        # a step of the first incident ends while its LLM pass is under way: the refresh comes at once, and the
        # LLM pass, which read the steps a minute ago, still tells the step as it ended
        skip(store, planned_step(store, first))
        reports.refresh(first)
        wait_until("the refreshed report", lambda: len(store.reports_for(first)) == 2, timeout=20)
        assert "cannot be resubmitted safely" in store.reports_for(first)[-1].markdown and not release.is_set()
        release.set()
        wait_until("both LLM passes to end", reports.idle, timeout=60)
        assert [r.generator for r in store.reports_for(first)] == ["deterministic"] * 3
        latest = store.reports_for(first)[-1]
        assert latest.data["llm"]["ok"] is False  # the failed pass says so, and is the latest
        assert latest.data["actions"][0]["message"] == CANNOT and "cannot be resubmitted safely" in latest.markdown
    finally:
        release.set()
        reports.stop(timeout_s=10)
        server.shutdown()
        server.server_close()


CANNOT = (f"job {SID} cannot be resubmitted safely: Ray no longer keeps its record (entrypoint, runtime_env), and "
          "Argus did not submit it")


def planned_step(store: Store, incident_id: str) -> Action:
    return store.add_action(Action(
        id="", incident_id=incident_id, kind="resubmit_job", target=Subject(kind=SubjectKind.JOB, id=SID),
        state=ActionState.PLANNED, idempotency_key=f"{incident_id}:policy:0:resubmit_job", requested_by="policy",
        reason="policy rule job-failed", dry_run=False,
        result={"step": 0, "preview": f"would resubmit {SID} as {SID}-r1 from checkpoint global_step_40 (step 40)"}))


def skip(store: Store, action: Action) -> Action:
    return store.transition_action(action.id, (action.state,), ActionState.SKIPPED,
                                   {**action.result, "message": CANNOT})


def test_the_report_follows_the_steps_as_they_end_without_another_pass(store: Store, shared: Path) -> None:
    incident_id = open_incident(store)
    reports = service(store, shared)
    [first] = reports.write(incident_id, llm=False)
    assert "Nothing yet" in first.markdown and reports.refresh_now(incident_id) is None  # nothing new to tell

    action = planned_step(store, incident_id)
    previewed = reports.refresh_now(incident_id)
    assert previewed is not None and previewed.id != first.id
    assert "waits for approval (policy rule job-failed). Preview: would resubmit" in previewed.markdown
    assert "from checkpoint global\\_step\\_40 (step 40)" in previewed.markdown

    skip(store, action)
    ended = reports.refresh_now(incident_id)
    assert ended is not None and f"skipped (policy rule job-failed). Outcome: job {SID} cannot be resubmitted " \
                                 "safely: Ray no longer keeps its record" in ended.markdown.replace("\\_", "_")
    assert ended.data["actions"][0]["message"] == CANNOT and ended.data["category"] == first.data["category"]
    assert ended.markdown.split("## What Argus did")[0] == first.markdown.split("## What Argus did")[0]
    assert reports.refresh_now(incident_id) is None  # told already
    assert [r.id for r in store.reports_for(incident_id)] == [first.id, previewed.id, ended.id]
    written = shared / "jobs" / SID / "rca" / f"{incident_id}.md"
    assert written.read_text() == ended.markdown  # the file next to the job is the latest too
    assert refresh_of_nothing(reports) is None


def refresh_of_nothing(reports: ReportService):  # type: ignore[no-untyped-def]
    """An incident without a report yet: its report pass to come reads the steps itself."""
    finding = Finding(category=Category.UNKNOWN, reason="JobFailed", subject=Subject(kind=SubjectKind.JOB, id="x-1"),
                      summary="job x-1 failed", severity=Severity.CRITICAL,
                      evidence=(Evidence(source="ray.jobs", text="status=FAILED"),),
                      first_seen=datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc))
    incident, _ = reports.store.record_finding(finding)
    return reports.refresh_now(incident.id)


def test_planning_and_each_step_ending_refresh_the_report_on_the_worker(store: Store, shared: Path) -> None:
    from argus.incidents.events import IncidentEvent
    from argus.incidents.subscribers import ReportSubscriber

    reports = service(store, shared)
    subscriber = ReportSubscriber(reports)
    reports.start()
    try:
        incident = store.get_incident(open_incident(store))
        subscriber.receive(IncidentEvent.opened(incident))
        action = planned_step(store, incident.id)
        subscriber.receive(IncidentEvent.planned(incident, [action]))  # queued after the first report's pass
        wait_until("the report with the plan", lambda: reports.idle() and "Preview: would resubmit" in (
            store.reports_for(incident.id) or [None])[-1].markdown, timeout=30)
        skip(store, action)
        reports.refresh(incident.id)  # what wiring's on_step_final does
        wait_until("the report with the outcome", lambda: reports.idle() and "cannot be resubmitted safely" in
                   store.reports_for(incident.id)[-1].markdown, timeout=30)
        # the first pass may already have read the plan (then the PLANNED refresh had nothing new): 2 or 3 reports
        assert store.reports_for(incident.id)[-1].data["actions"][0]["message"] == CANNOT
    finally:
        reports.stop()
