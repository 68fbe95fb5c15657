"""Alertmanager's webhook: alerts from the rules Argus exports (and any others) become findings, filed through the
same deduplication as Argus's own detections (argus/incidents/alertmanager.py says how an alert becomes a finding).

A request's alerts are queued in the store (argus/store/alert_inbox.py: one INSERT, so a storm is accepted as fast as
Alertmanager sends it) and filed by the alert filer (argus/incidents/alert_filer.py). Where nothing was waiting, the
request waits up to ALERT_WAIT_S for its own alerts to be filed and answers 200 with their incidents; otherwise it
answers 202 with how many were queued. Either way, an alert answered for is in the store: nothing accepted is lost.
A store that cannot take them answers 503 (Alertmanager sends them again). Configure Alertmanager with
`http_config.authorization.credentials: <an Argus operator token>`.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from argus.api.auth import require
from argus.incidents.alert_filer import AlertFiler
from argus.incidents.alertmanager import AlertFiled, AlertmanagerWebhook
from argus.store.tokens import Role

router = APIRouter(tags=["alerts"])
ALERTMANAGER_PATH = "/v1/alerts/alertmanager"
ALERT_WAIT_S = 5.0  # how long a request waits for its alerts to be filed (Alertmanager's own timeout is longer)


# 202: filing takes longer than ALERT_WAIT_S (a storm, a busy host): the alerts are queued, and filed behind the answer
@router.post(ALERTMANAGER_PATH, dependencies=[Depends(require(Role.OPERATOR))],
             responses={202: {"description": "accepted and queued: filed within seconds, `queued` says how many"}})
async def alertmanager(request: Request, body: Annotated[AlertmanagerWebhook, Body()]) -> Any:
    """Queue the alerts, then (where none were waiting) wait for them to be filed: firing alerts open or fold into
    incidents, resolved ones resolve the incident they opened."""
    filer: AlertFiler = request.app.state.alert_filer
    alerts = [alert.model_dump(mode="json") for alert in body.alerts]
    ids, waiting = await run_in_threadpool(filer.store.alert_inbox.put, alerts, group_key=body.groupKey,
                                           holder=filer.holder)
    # Started after the put (the first webhook starts it): started before, its first pass could take the alerts
    # already waiting, and this request would wait for its own as if none were queued ahead of them.
    filer.start().wake()
    filed = await run_in_threadpool(filer.wait_for, ids, ALERT_WAIT_S) if waiting == 0 else None
    answer = _answer(filed, queued=len(ids))
    request.state.audit_detail = {"group": body.groupKey[:200], **{k: answer[k] for k in
                                                                   ("opened", "reopened", "resolved", "queued")}}
    return answer if filed is not None else JSONResponse(answer, status_code=202)


def _answer(filed: dict[int, AlertFiled] | None, *, queued: int) -> dict[str, Any]:
    """What the webhook answers: the incidents its alerts opened, reopened and resolved and how many folded into open
    ones; or, when they are still queued, how many."""
    if filed is None:
        return {"opened": [], "reopened": [], "folded": 0, "resolved": [], "queued": queued}
    outcomes = [filed[i] for i in sorted(filed)]

    def ids(kind: str) -> list[str]:
        return [o.incident_id for o in outcomes if o.outcome == kind and o.incident_id]

    return {"opened": ids("opened"), "reopened": ids("reopened"),
            "folded": sum(o.outcome == "folded" for o in outcomes), "resolved": ids("resolved"), "queued": 0}
