"""A reopened incident on the web page and in the API: the reopen count beside the occurrences, and the reopening
on the incident's timeline. The site is tests/web/conftest.py's (real store, real app); the fault comes back
through the store's own filing."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from argus.store.tokens import Role
from core.types import IncidentState
from tests.web.conftest import Site, login


def reopen_the_site_incident(site: Site, times: int) -> None:
    """Resolve the site's node-lost incident and file its finding again, `times` over: its fault flapping."""
    [finding] = site.store.findings_for(site.incident_id)
    for _ in range(times):
        site.store.set_state(site.incident_id, IncidentState.RESOLVED)
        incident, recorded = site.store.file_finding(finding, reopen_within_s=1800)
        assert (recorded, incident.id) == ("reopened", site.incident_id)


def viewer(site: Site) -> TestClient:
    client = TestClient(site.app, raise_server_exceptions=False)
    assert login(client, site.tokens[Role.VIEWER]).status_code == 303
    return client


def test_the_pages_show_how_often_an_incident_was_reopened(site: Site) -> None:
    client = viewer(site)
    assert "reopened" not in client.get("/ui/incidents").text  # never reopened: nothing said
    reopen_the_site_incident(site, 2)

    listing = client.get("/ui/incidents").text
    row = re.search(r'<td class="num">(.*?)</td>', listing, re.S)
    assert row and re.sub(r"<[^>]+>", "", row.group(1)).split() == ["3", "reopened", "2×"]

    page = client.get(f"/ui/incidents/{site.incident_id}").text
    assert re.search(r"<dt>Reopened</dt><dd>2× \(its fault came back after it was resolved\)</dd>", page)
    assert "the fault came back: reopened (2nd time)" in page
    assert "<dt>Last seen</dt>" in page and "(3×)" in page


def test_the_api_shows_the_reopen_count_beside_the_occurrences(site: Site) -> None:
    api = TestClient(site.app, headers={"Authorization": f"Bearer {site.tokens[Role.VIEWER]}"})
    assert api.get(f"/v1/incidents/{site.incident_id}").json()["incident"]["reopened"] == 0
    reopen_the_site_incident(site, 1)

    one = api.get(f"/v1/incidents/{site.incident_id}").json()["incident"]
    assert (one["state"], one["occurrences"], one["reopened"]) == ("open", 2, 1)
    [listed] = api.get("/v1/incidents").json()["items"]
    assert (listed["id"], listed["reopened"]) == (site.incident_id, 1)
