"""Path parameters several routes share, with the constraints the OpenAPI document states (a client generated from
it sends only what the route accepts)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path

ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"

IncidentIdPath = Annotated[str, Path(pattern=ID_PATTERN, description="an incident id, e.g. inc-0123456789ab")]
ActionIdPath = Annotated[str, Path(pattern=ID_PATTERN, description="a remediation step id, e.g. act-0123456789ab")]
