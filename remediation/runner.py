"""The remediation runner: plans steps for incidents, runs approved ones within the guards, and recovers
after a crash without repeating anything.

An action's life: planned -> approved -> running -> succeeded / failed / skipped (or planned -> rejected).
In dry-run mode steps are planned and then run as dry runs (skipped, saying what they would do); in
approval mode a person or the agent approves each; in auto mode they are approved when planned. Each step
has an idempotency key `<incident>:<source>:<n>:<kind>`, so planning twice plans once.

Each step planned gets a preview (`result["preview"]`): its dry run's message, what it would do or why it would
not ("job X cannot be resubmitted safely: ..."), which the IM message and the report show until the step's own
outcome replaces it. A dry run reads Ray and the disk and changes nothing; the previews of one plan run side by
side and are waited for at most `preview_timeout_s` (the Ray request timeout unless given), a minute after a
plan whose previews ran out of time only `PREVIEW_AFTER_TIMEOUT_S` (Ray hanging in a storm of incidents must
not make each plan wait the full bound). A preview that fails or is late is left out; planning never fails for one.
`plan` runs on the incident bus's remediation worker (argus/incidents/subscribers.py), never on the
detection tick, and in the API request that proposes steps.

Running is claimed with a compare-and-set (approved -> running) in the store, so two runners never run one
step. Steps of one incident run in order: a step waits while an earlier one is planned, approved or
running. After a crash, `recover()` looks at each step left running: keep_scene and stop_job are safe to
run again; resubmit_job is too (the new job's id is deterministic and Ray refuses a second job with it); a
drain is checked (the node draining, offline or gone: done) and otherwise reported as interrupted for a
person, never repeated. An action with no incident is the ops agent's direct call, recorded so the guards count
it: this runner never runs one, and one a crash left running is marked failed.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from loguru import logger

from core.errors import ArgusError, Conflict
from core.readers import Readers
from core.types import Action, ActionState, Incident, Subject, SubjectKind, utcnow
from remediation import guards as guard
from remediation.actions import STEPS, Context, chain_of, failed, jobs_of, node_of, ray_list, registered_node
from remediation.policy import Mode, Policy, Step

ACTOR = "argus-remediation"
OPEN_STATES = (ActionState.PLANNED, ActionState.APPROVED, ActionState.RUNNING)
FINAL_STATES = (ActionState.SUCCEEDED, ActionState.FAILED, ActionState.SKIPPED, ActionState.REJECTED)
PREVIEW_MAX = 2000  # characters of a preview kept in the action's result
PREVIEW_AFTER_TIMEOUT_S = 1.0  # the previews' bound for a minute after a plan whose previews ran out of time
PREVIEW_COOLDOWN_S = 60.0


class Remediator:
    def __init__(self, store: Any, policy: Policy, ctx: Context, *, clock: Callable[[], datetime] = utcnow,
                 on_step_final: Callable[[Action], None] | None = None,
                 preview_timeout_s: float | None = None, readers: Readers | None = None) -> None:
        """`on_step_final(action)`: a step reached one of FINAL_STATES (wiring counts it in Argus's metrics and
        refreshes the incident's report). Who is told of planned steps is the caller's business: `plan` returns
        them. `preview_timeout_s`: how long a plan waits for its steps' previews (default: the Ray request
        timeout of `ctx`). `readers`: the API's requests being answered; a pass gives way to them between steps
        (core/readers.py)."""
        self.store = store
        self.policy = policy
        self.readers = readers
        self.ctx = ctx
        self.clock = clock
        self.on_step_final = on_step_final
        self.preview_timeout_s = ctx.request_timeout_s if preview_timeout_s is None else max(0.0, preview_timeout_s)
        self._previews_late_until = 0.0  # time.monotonic() until which previews get PREVIEW_AFTER_TIMEOUT_S

    # -- planning ---------------------------------------------------------------------------------------------

    def plan(self, incident: Incident, *, steps: list[Step] | None = None, requested_by: str = "policy",
             mode: Mode | None = None) -> list[Action]:
        """Plan the policy's steps for the incident (or `steps`, proposed by someone), each with its preview;
        idempotent (steps planned before are returned as they are, their previews not made again)."""
        rule = self.policy.rule_for(incident) if steps is None else None
        steps = list(steps) if steps is not None else (list(rule.steps) if rule else [])
        mode = mode or self.policy.mode_for(rule)
        if mode is Mode.OFF or not steps:
            return []
        source = "policy" if rule else "req-" + hashlib.sha256(
            json.dumps([s.model_dump() for s in steps], sort_keys=True).encode()).hexdigest()[:8]
        keys = [f"{incident.id}:{source}:{index}:{step.action}" for index, step in enumerate(steps)]
        try:
            known = {a.idempotency_key for a in self.store.list_actions(incident.id)}
        except ArgusError:
            known = set()
        previews = self._previews(incident, {i: s for i, s in enumerate(steps) if keys[i] not in known})
        planned = []
        for index, step in enumerate(steps):
            result: dict[str, Any] = {"step": index, "params": step.params, "mode": mode.value}
            if index in previews:
                result["preview"] = previews[index]
            action = Action(
                id="", incident_id=incident.id, kind=step.action, target=self._target(incident, step.action),
                state=ActionState.APPROVED if mode is Mode.AUTO else ActionState.PLANNED,
                idempotency_key=keys[index], requested_by=requested_by,
                reason=f"policy rule {rule.name}" if rule else f"requested by {requested_by}",
                dry_run=mode is Mode.DRY_RUN, result=result,
            )
            planned.append(self.store.add_action(action))
        logger.bind(incident=incident.id).info("planned {} ({}): {}", len(planned), mode.value,
                                               ", ".join(a.kind for a in planned))
        return planned

    def _previews(self, incident: Incident, steps: dict[int, Step]) -> dict[int, str]:
        """Each step's dry-run message by its index, those that came within the bound (see the module docstring)."""
        if not steps:
            return {}
        got: dict[int, str] = {}
        lock = threading.Lock()
        log = logger.bind(incident=incident.id)

        def preview(index: int, step: Step) -> None:
            try:
                outcome = STEPS[step.action](self.ctx, incident, dict(step.params), True)
            except Exception as exc:  # noqa: BLE001 - a preview that fails is left out, never an error of the plan
                log.info("no preview of {}: {}", step.action, getattr(exc, "message", None) or exc)
                return
            with lock:
                got[index] = outcome.message[:PREVIEW_MAX]

        now = time.monotonic()
        bound = min(self.preview_timeout_s, PREVIEW_AFTER_TIMEOUT_S) if now < self._previews_late_until \
            else self.preview_timeout_s
        deadline = now + bound
        threads = {i: threading.Thread(target=preview, args=(i, s), name=f"argus-preview-{s.action}", daemon=True)
                   for i, s in steps.items()}
        for thread in threads.values():
            thread.start()
        for thread in threads.values():
            thread.join(max(0.0, deadline - time.monotonic()))
        late = [steps[i].action for i, thread in threads.items() if thread.is_alive()]
        if late:
            self._previews_late_until = time.monotonic() + PREVIEW_COOLDOWN_S
            log.warning("no preview of {}: not ready within {:.1f} s (planned without it)", ", ".join(late), bound)
        with lock:
            return dict(got)

    @staticmethod
    def _target(incident: Incident, kind: str) -> Subject:
        node_id, ip = node_of(incident)
        if kind == "drain_node" and (node_id or ip):
            return Subject(kind=SubjectKind.NODE, id=node_id or ip or "", name=ip)
        jobs = jobs_of(incident)
        if kind in ("resubmit_job", "stop_job") and jobs:
            return Subject(kind=SubjectKind.JOB, id=jobs[0], name=", ".join(jobs[1:]) or None)
        return incident.subject

    # -- decisions ----------------------------------------------------------------------------------------------

    def approve(self, action_id: str, *, who: str) -> Action:
        action = self.store.get_action(action_id)
        if action.dry_run:
            raise Conflict(f"action {action_id} is a dry run: there is nothing to approve",
                           hint="switch the policy's mode to approval to have steps that wait for approval")
        approved = self.store.transition_action(action_id, (ActionState.PLANNED,), ActionState.APPROVED,
                                                {**action.result, "approved_by": who,
                                                 "approved_at": self.clock().isoformat()})
        self._changed(approved)
        return approved

    def reject(self, action_id: str, *, who: str, reason: str) -> Action:
        action = self.store.get_action(action_id)
        rejected = self.store.transition_action(action_id, (ActionState.PLANNED, ActionState.APPROVED),
                                                ActionState.REJECTED,
                                                {**action.result, "rejected_by": who, "reason": reason[:500]})
        self._changed(rejected)
        return rejected

    # -- running ------------------------------------------------------------------------------------------------

    def run_pending(self) -> list[Action]:
        """Run every step that is approved (or a dry run), due, and next in its incident; return what ran.

        Reads the runnable steps and the open steps of their incidents (is an earlier step of the plan still open?);
        the guards' history (the steps that changed within their longest window: a day, or min_drain_interval_s if
        longer) only once a step that changes something may run, never for dry runs. A step that ran is updated in
        place, so the next step of its plan may run in the same pass."""
        runnable = self.store.runnable_actions()
        if not runnable:
            return []
        actions = {a.id: a for a in self.store.actions_of({a.incident_id for a in runnable if a.incident_id},
                                                          states=OPEN_STATES)}
        plans: dict[tuple[str | None, str], list[str]] = {}
        for a in actions.values():
            plans.setdefault(_plan_of(a), []).append(a.id)
        history: dict[str, Action] | None = None
        ran = []
        for step in runnable:
            action = actions.get(step.id)  # None: the agent's direct call (no incident), or it ended meanwhile
            if action is None or self._earlier_open(action, actions, plans):
                continue
            if self.readers is not None:
                self.readers.give_way()
            if action.dry_run:
                seen: list[Action] = []  # a dry run passes every guard
            else:
                if history is None:
                    horizon = timedelta(seconds=max(86400.0, self.policy.guards.min_drain_interval_s))
                    history = {a.id: a for a in self.store.list_actions(updated_since=self.clock() - horizon,
                                                                        or_states=OPEN_STATES)}
                seen = list({**history, **actions}.values())
            result = self._run(action, seen)
            if result is not None:
                ran.append(result)
                actions[result.id] = result
                if history is not None:
                    history[result.id] = result
        return ran

    def _earlier_open(self, action: Action, actions: dict[str, Action],
                      plans: dict[tuple[str | None, str], list[str]]) -> bool:
        step = action.result.get("step", 0)
        return any(actions[i].result.get("step", 0) < step and actions[i].state in OPEN_STATES
                   for i in plans.get(_plan_of(action), ()))

    def _run(self, action: Action, history: list[Action]) -> Action | None:
        incident = self.store.get_incident(action.incident_id)
        now = self.clock()
        grace = float(action.result.get("params", {}).get("grace_s", 0) or 0)
        if grace and incident.detected_at + timedelta(seconds=grace) > now:
            return None  # not due yet (idle GPUs get their grace period)
        verdict = guard.check(self.policy.guards, action, incident, history, now=now,
                              shared_root=self.ctx.shared_root, node_counts=self.node_counts)
        if verdict.waiting:
            return None
        source = ActionState.PLANNED if action.state is ActionState.PLANNED else ActionState.APPROVED
        if not verdict.allowed:
            refused = self._move(action, source, ActionState.SKIPPED, guard=verdict.reason,
                                 message=f"refused by a guard: {verdict.reason}")
            return refused
        roots = [chain_of(self.ctx.folders.of(s))[0] for s in jobs_of(incident)]
        try:
            running = self.store.transition_action(action.id, (source,), ActionState.RUNNING,
                                                   {**action.result, "roots": roots,
                                                    "started_at": now.isoformat()})
        except Conflict:
            return None  # another runner claimed it
        self._changed(running)
        try:
            outcome = STEPS[action.kind](self.ctx, incident, action.result.get("params", {}), action.dry_run)
        except ArgusError as exc:
            outcome = failed(f"{exc.message}" + (f" ({exc.hint})" if exc.hint else ""))
        except Exception as exc:  # noqa: BLE001 - a bug in one step must not stop the others; it is recorded
            logger.opt(exception=exc).error("remediation step {} of {} crashed", action.kind, incident.id)
            outcome = failed(f"{type(exc).__name__}: {exc}")
        finished = self.store.transition_action(
            action.id, (ActionState.RUNNING,), outcome.state,
            {**running.result, "message": outcome.message, **outcome.data,
             "finished_at": self.clock().isoformat()})
        self._audit(finished, incident)
        self._changed(finished)
        return finished

    def _move(self, action: Action, source: ActionState, target: ActionState, **result: Any) -> Action | None:
        try:
            moved = self.store.transition_action(action.id, (source,), target, {**action.result, **result})
        except Conflict:
            return None
        self._changed(moved)
        return moved

    def node_counts(self) -> tuple[int, int]:
        """(nodes drained or offline, nodes in all: registered ones, or Ray's alive and drained ones where more),
        as the drain share guard counts them; also for the agent's direct drains (argus/api/agent_policy.py)."""
        records = self.ctx.registry.list()
        drained = sum(r.state.value in ("draining", "offline") for r in records)
        try:
            alive = sum(n.get("state") == "ALIVE" and not n.get("is_head_node")
                        for n in ray_list(self.ctx, "list_nodes", detail=True))
        except ArgusError:
            alive = 0
        return drained, max(len(records), alive + drained)

    # -- crash recovery -----------------------------------------------------------------------------------------

    def recover(self) -> list[Action]:
        """Deal with steps a crash left running (see the module docstring); return what was changed."""
        changed = []
        for action in self.store.list_actions():
            if action.state is not ActionState.RUNNING:
                continue
            if action.incident_id is None:  # the agent's direct call (argus/api/agent_policy.py): never repeated
                moved = self._move(action, ActionState.RUNNING, ActionState.FAILED,
                                   message="interrupted by an Argus restart; a direct call is not repeated: "
                                           f"check {action.target.kind.value} {action.target.id}, call again if needed")
            elif action.kind in ("keep_scene", "stop_job", "resubmit_job") or action.dry_run:
                moved = self._move(action, ActionState.RUNNING, ActionState.APPROVED if not action.dry_run
                                   else ActionState.PLANNED, recovered="interrupted by a restart; safe to run again")
            else:
                moved = self._recover_drain(action)
            if moved is not None:
                changed.append(moved)
        return changed

    def _recover_drain(self, action: Action) -> Action | None:
        incident = self.store.get_incident(action.incident_id)
        node_id, ip = node_of(incident)
        record = registered_node(self.ctx.registry, node_id, ip)
        if record is not None and record.state.value in ("draining", "offline"):
            return self._move(action, ActionState.RUNNING, ActionState.SUCCEEDED,
                              message=f"the drain had happened before the restart: node {record.name} is "
                                      f"{record.state.value}")
        try:
            alive = any(n.get("state") == "ALIVE" and (n.get("node_id") == node_id or n.get("node_ip") == ip)
                        for n in ray_list(self.ctx, "list_nodes", detail=True))
        except ArgusError:
            alive = True  # unknown: report, do not guess
        if not alive:
            return self._move(action, ActionState.RUNNING, ActionState.SUCCEEDED,
                              message="Ray no longer lists the node alive: nothing can be scheduled there")
        return self._move(action, ActionState.RUNNING, ActionState.FAILED,
                          message="interrupted by an Argus restart; not repeated: check the node and drain it "
                                  "by hand (POST /v1/nodes/{name}/drain) if it still needs it")

    # -- records ------------------------------------------------------------------------------------------------

    def _audit(self, action: Action, incident: Incident) -> None:
        try:
            status = {ActionState.SUCCEEDED: 200, ActionState.SKIPPED: 204}.get(action.state, 500)
            self.store.audit(actor=ACTOR, role=None, method="STEP", path=f"/remediation/{action.kind}", status=status,
                             target=json.dumps({"action": action.id, "incident": incident.id}),
                             detail={"state": action.state.value, "dry_run": action.dry_run,
                                     "message": str(action.result.get("message", ""))[:500]})
        except ArgusError as exc:
            logger.error("could not audit remediation step {}: {}", action.id, exc)

    def _changed(self, action: Action) -> None:
        if self.on_step_final is not None and action.state in FINAL_STATES:
            try:
                self.on_step_final(action)
            except Exception as exc:  # noqa: BLE001 - counting and reporting must not break acting
                logger.warning("step-final hook failed for {}: {}", action.id, exc)



def _plan_of(action: Action) -> tuple[str | None, str]:
    """The plan a step belongs to: its incident and its idempotency key without the step's own part."""
    return action.incident_id, action.idempotency_key.rsplit(":", 2)[0]
