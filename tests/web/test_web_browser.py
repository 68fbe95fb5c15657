"""The web page in a real browser: Debian's chromium, driven by Playwright, against the real app served by
uvicorn on a free port, over a SQLite store filled through the real code paths (tests/web/conftest.py).

An operator logs in, opens the incident from the list and approves a step; the store then holds the step
approved by that token and the audit log names it. A viewer sees no approve button. Full-page screenshots
of the main pages go to test-artifacts/screenshots/ for the run's artifacts.

Without chromium or Playwright the test is skipped, or fails where ARGUS_REQUIRE_BROWSER=1 says the browser
must be exercised (`make test`).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from argus.store.tokens import Role
from core.types import ActionState, Category, Finding, Severity, Subject, SubjectKind
from stage.localstack.ports import free_port
from tests.helpers import wait_until
from tests.web.conftest import TOKEN_NAMES, Site, build_site

pytestmark = [pytest.mark.browser]

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1366, "height": 768}


def _need_browser() -> Any:
    """playwright.sync_api, or a skip (a failure where ARGUS_REQUIRE_BROWSER=1) saying what is missing."""
    problem = None
    if not CHROMIUM.is_file():
        problem = f"Debian's chromium is not installed at {CHROMIUM}: run `bash scripts/ensure-system-deps.sh`"
    try:
        from playwright import sync_api
    except ImportError:
        sync_api, problem = None, problem or "Playwright is not installed: run `pip install -e '.[dev]'`"
    if problem is not None:
        if os.environ.get("ARGUS_REQUIRE_BROWSER") == "1":
            pytest.fail(problem, pytrace=False)
        pytest.skip(problem)
    return sync_api


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Site, str]]:
    """The site's app under uvicorn on a free loopback port, in a thread of this process."""
    site = build_site(tmp_path)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(site.app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, name="uvicorn-web-test", daemon=True)
    thread.start()
    try:
        wait_until("uvicorn to serve the app", lambda: server.started, timeout=30, interval=0.1)
        yield site, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        site.store.close()


def _fits_the_width(page: Any) -> bool:
    """Nothing makes the page scroll sideways: wide content scrolls inside its own box."""
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


def _login(page: Any, base: str, token: str) -> None:
    page.goto(f"{base}/ui/incidents")
    page.wait_for_url(re.compile(r".*/ui/login\?next=.*"))
    page.fill("#token", token)
    page.click("button:has-text('Log in')")
    page.wait_for_url(f"{base}/ui/incidents")


def test_an_operator_logs_in_opens_an_incident_and_approves_a_step(served: tuple[Site, str], tmp_path: Path) -> None:
    sync_api = _need_browser()
    site, base = served
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    step = site.step("keep_scene")
    incident = site.store.get_incident(site.incident_id)
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
            viewport=VIEWPORT)
        try:
            page = context.new_page()
            page.goto(f"{base}/")
            page.wait_for_url(re.compile(r".*/ui/login\?next=.*"))
            assert page.locator("#token").is_visible()
            page.screenshot(path=str(SCREENSHOTS / "login.png"), full_page=True)

            # a wrong token is told plainly, and the form stays
            page.fill("#token", "argus_00000000_" + "A" * 43)
            page.click("button:has-text('Log in')")
            assert "unknown, revoked or expired" in page.locator(".flash.error").inner_text()

            page.fill("#token", site.tokens[Role.OPERATOR])
            page.click("button:has-text('Log in')")
            page.wait_for_url(f"{base}/ui/incidents")
            assert page.locator(".who .name").inner_text() == TOKEN_NAMES[Role.OPERATOR]
            assert _fits_the_width(page)
            page.screenshot(path=str(SCREENSHOTS / "incidents.png"), full_page=True)

            page.click(f"a.summary-link:has-text('{incident.summary}')")
            page.wait_for_url(f"{base}/ui/incidents/{site.incident_id}")
            assert page.locator("article.report-body h2:has-text('Summary')").is_visible()
            assert page.locator("#evidence").get_by_text("missing too many heartbeats").first.is_visible()
            assert _fits_the_width(page)
            page.screenshot(path=str(SCREENSHOTS / "incident.png"), full_page=True)

            # at 1366 px the steps table fits whole, so the decision buttons are in view without scrolling
            assert page.evaluate("(() => { const w = document.querySelector('#actions .table-wrap');"
                                 " return w.scrollWidth <= w.clientWidth; })()")
            row = page.locator(f"tr[data-action='{step.id}']")
            assert row.locator("[data-state]").inner_text() == "planned"
            row.locator("button:has-text('Approve')").click()
            page.wait_for_url(re.compile(rf".*/ui/incidents/{site.incident_id}\?changed={step.id}"))
            assert f"Step keep_scene ({step.id}) is approved." in page.locator(".flash.ok").inner_text()
            assert page.locator(f"tr[data-action='{step.id}'] [data-state]").inner_text() == "approved"
            assert page.locator(f"tr[data-action='{step.id}'] button:has-text('Approve')").count() == 0
            page.screenshot(path=str(SCREENSHOTS / "incident-approved.png"), full_page=True)

            page.goto(f"{base}/ui/nodes")
            assert page.locator("a:has-text('gpu-07')").is_visible()
            assert "cannot reach Ray state API" in page.locator(".flash.warn").inner_text()
            assert _fits_the_width(page)
            page.screenshot(path=str(SCREENSHOTS / "nodes.png"), full_page=True)

            page.goto(f"{base}/ui/jobs")
            assert page.locator("h2:has-text('Jobs cannot be listed now')").is_visible()
            assert _fits_the_width(page)
            page.screenshot(path=str(SCREENSHOTS / "jobs.png"), full_page=True)

            page.click("button:has-text('Log out')")
            page.wait_for_url(f"{base}/ui/login")
        finally:
            context.close()

    approved = site.store.get_action(step.id)
    assert approved.state is ActionState.APPROVED and approved.result["approved_by"] == TOKEN_NAMES[Role.OPERATOR]
    path = f"/ui/incidents/{site.incident_id}/actions/{step.id}/approve"
    [record] = [r for r in site.store.list_audit() if r.path == path]
    assert (record.actor, record.role, record.outcome) == (TOKEN_NAMES[Role.OPERATOR], "operator", "ok")
    for name in ("login", "incidents", "incident", "incident-approved", "nodes", "jobs"):
        assert (SCREENSHOTS / f"{name}.png").stat().st_size > 1000, name


def test_a_viewer_sees_the_incident_and_no_approve_button(served: tuple[Site, str], tmp_path: Path) -> None:
    sync_api = _need_browser()
    site, base = served
    site.app.state.web.refresh_s = 5  # the list's own script reloads it this often
    problems: list[str] = []
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
            viewport=VIEWPORT)
        try:
            page = context.new_page()
            # a script or style the page's Content-Security-Policy blocks shows up as a console error
            page.on("console", lambda m: problems.append(f"{m.text} {m.location}") if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            _login(page, base, site.tokens[Role.VIEWER])
            # the list refreshes itself: an incident opened after the page loaded appears without a reload
            site.store.record_finding(Finding(category=Category.DISK_FULL, reason="DiskFull", severity=Severity.WARNING,
                                              subject=Subject(kind=SubjectKind.NODE, id="gpu-08", name="10.0.0.8"),
                                              summary="disk of 10.0.0.8 is full"))
            page.locator("a.summary-link:has-text('disk of 10.0.0.8 is full')").wait_for(timeout=60_000)
            assert page.locator("#refreshed").inner_text().startswith("updated")
            page.goto(f"{base}/ui/incidents/{site.incident_id}")
            for step in site.actions:
                assert page.locator(f"tr[data-action='{step.id}'] [data-state]").inner_text() == "planned"
            assert page.locator("button:has-text('Approve')").count() == 0
            assert page.locator("button:has-text('Reject')").count() == 0
            assert page.locator("button:has-text('Resolve')").count() == 0
        finally:
            context.close()
    assert not problems, problems
    assert all(site.store.get_action(a.id).state is ActionState.PLANNED for a in site.actions)
