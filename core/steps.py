"""What a remediation step says about itself, in one place for the IM message, the report and the API.

A step's own words are its outcome's message once it is final (`result["message"]`: "resubmitted job-a as
job-a-r1 from checkpoint global_step_40 (step 40), ...", "job X cannot be resubmitted safely: ..."), else the
preview the runner stored when it planned it (`result["preview"]`: the dry run's message, what it would do or
why it would not). Its status is a few trusted words: its state, or what a planned step waits for.

The text is untrusted (it quotes job ids, paths and Ray's answers): each reader cleans and cuts it for its medium.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.types import Action, ActionState

FINAL = frozenset({ActionState.SUCCEEDED, ActionState.FAILED, ActionState.SKIPPED, ActionState.REJECTED})
_WAITING = {ActionState.PLANNED: "waits for approval", ActionState.APPROVED: "approved, will run",
            ActionState.RUNNING: "running"}


@dataclass(frozen=True)
class StepSaid:
    action_id: str
    kind: str
    status: str  # trusted words: "succeeded", "dry run", "waits for approval", "failed (dry run)"...
    text: str  # untrusted: the outcome's message, the rejection, or the preview; "" when none is known
    final: bool  # True: `text` is what happened; False: what it would do (a preview)


def said(action: Action) -> StepSaid:
    result = action.result or {}
    final = action.state in FINAL
    if action.dry_run:
        status = "dry run" if action.state in (ActionState.PLANNED, ActionState.RUNNING, ActionState.SKIPPED) \
            else f"{action.state.value} (dry run)"
    else:
        status = action.state.value if final else _WAITING.get(action.state, action.state.value)
    text = ""
    if final and action.state is ActionState.REJECTED:
        text = f"rejected by {result.get('rejected_by') or 'someone'}: {result.get('reason') or 'no reason given'}"
    elif final and result.get("message"):
        text = str(result["message"])
    if not text and result.get("preview"):
        return StepSaid(action.id, action.kind, status, str(result["preview"]), final=False)
    return StepSaid(action.id, action.kind, status, text, final=final and bool(text))
