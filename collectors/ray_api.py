"""Ray's dashboard as a source: state API calls (`ray.util.state`) and the dashboard's own JSON routes, with Ray's
errors wrapped into ours, and the hint and cause text every collector reading the dashboard gives when it cannot."""

from __future__ import annotations

from typing import Any

import httpx

from core.errors import SourceUnavailable

LIST_LIMIT = 10_000
DASHBOARD_HINT = (
    "check that the Ray head is up and that ARGUS_RAY_DASHBOARD_URL points at its dashboard "
    "(http://<head>:8265 by default)"
)


def cause_of(exc: BaseException) -> str:
    """The first line of an error, short enough for a log line or an incident."""
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


class RayStateApi:
    """`ray.util.state` list calls against one dashboard; `state_api` stands in for the module (a simulator)."""

    def __init__(self, dashboard_url: str, timeout_s: float, state_api: Any = None) -> None:
        self.dashboard_url = dashboard_url.rstrip("/")
        self.timeout_s = timeout_s
        self._api = state_api

    def get_json(self, path: str) -> Any:
        """The JSON body of the dashboard route `path` (e.g. "/api/cluster_status"); SourceUnavailable if Ray does
        not answer it with JSON. A `state_api` stand-in that has `get_json` answers instead (a simulator)."""
        url = f"{self.dashboard_url}{path}"
        try:
            if self._api is not None and hasattr(self._api, "get_json"):
                return self._api.get_json(path)
            response = httpx.get(url, timeout=self.timeout_s)
            response.raise_for_status()
            return response.json()
        except Exception as exc:  # httpx's errors, a body that is not JSON, a simulator's own
            raise SourceUnavailable("Ray dashboard", url, cause_of(exc), hint=DASHBOARD_HINT) from exc

    def call(self, fn_name: str, **kwargs: Any) -> list[Any]:
        """`ray.util.state.<fn_name>(**kwargs)` as a list; SourceUnavailable if Ray does not answer."""
        if self._api is None:
            from ray.util import state  # imported late: it is heavy and the API process may not need it

            self._api = state
        try:
            return list(
                getattr(self._api, fn_name)(
                    address=self.dashboard_url,
                    timeout=max(1, int(self.timeout_s)),
                    limit=LIST_LIMIT,
                    raise_on_missing_output=False,
                    **kwargs,
                )
            )
        except Exception as exc:  # Ray raises several unrelated types here; all mean "not reachable"
            raise SourceUnavailable("Ray state API", self.dashboard_url, cause_of(exc), hint=DASHBOARD_HINT) from exc
