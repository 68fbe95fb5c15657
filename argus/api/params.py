"""Path and query parameters several routes share, with the constraints the OpenAPI document states (a client
generated from it sends only what the route accepts).

An id in a path never holds ':' as the route matches it (the `ident` convertor): `/v1/incidents/{id}` would otherwise
also match `/v1/incidents/inc-1:resolve`, and a GET there would answer "405, Allow: GET" for a path whose only
method is POST. The rest of the id's pattern is checked after matching, so a malformed id is a 422 naming it."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query
from starlette.convertors import Convertor, register_url_convertor

ID_CHARS = "[A-Za-z0-9_-]{1,64}"
ID_PATTERN = rf"^{ID_CHARS}$"


class _IdConvertor(Convertor[str]):
    regex = "[^/:]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("ident", _IdConvertor())

IncidentIdPath = Annotated[str, Path(pattern=ID_PATTERN, description="an incident id, e.g. inc-0123456789ab")]
ActionIdPath = Annotated[str, Path(pattern=ID_PATTERN, description="a remediation step id, e.g. act-0123456789ab")]
IncidentIdQuery = Annotated[str | None, Query(pattern=ID_PATTERN, description="only this incident's")]
