"""What the API's and the web page's routes reach through the app: set once by `create_app`, read typed here.

Every part is set (None where this Argus runs without it), so a route never guesses with getattr.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import Request

from core.errors import NotConfigured

if TYPE_CHECKING:
    from argus.approval_links import ApprovalLinks
    from argus.incidents.desk import IncidentDesk
    from remediation.runner import Remediator


def incidents_of(request: Request) -> IncidentDesk:
    desk: IncidentDesk = request.app.state.incidents
    return desk


def remediator_or_none(request: Request) -> Remediator | None:
    found: Remediator | None = request.app.state.remediator
    return found


def remediator_of(request: Request) -> Remediator:
    """The remediation runner; NotConfigured (503) where this Argus runs without one."""
    found = remediator_or_none(request)
    if found is None:
        raise NotConfigured("remediation is not running in this Argus", hint="start it with `argus serve`")
    return found


def approval_links_of(request: Request) -> ApprovalLinks | None:
    links: ApprovalLinks | None = request.app.state.approval_links
    return links
