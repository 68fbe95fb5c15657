"""One channel-neutral message per incident event, and the digest that groups several.

Everything that came from a log line, a job's metadata or an LLM (summary, job and node names, owner, report
summary) is untrusted. It is cleaned here once for every channel: control and invisible formatting characters
removed (bidi overrides can make a line read backwards), whitespace folded onto one line (no Markdown heading or
quote can start), mass mentions (@all, @here, @channel, @everyone, @所有人) broken with a word joiner, and URLs
defanged with a zero-width space after the scheme so no client auto-links them. Each channel then escapes what is
special in its own markup (`argus.notify.channels.escape_*`) and cuts to its platform's documented limits.

Trusted: the event, category, severity and state (closed enums), the incident id (made by the store), and links
built from the configured public URL.

Remediation's steps (`steps`, from the PLANNED event's actions, core.steps) are one short line each: the step, its
status (trusted words) and what it did or would do, or why not ("resubmit_job (dry run): job X cannot be
resubmitted safely: ..."); the text is untrusted (job ids, paths, Ray's answers) and cut to `STEP_TEXT_MAX`, at most
`STEPS_MAX` steps listed and the rest counted.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol
from urllib.parse import quote

from core import signal_keys as keys
from core.names import Named, clean, job_label, job_of, label_of, node_of
from core.steps import said
from core.types import Action, Incident, IncidentState, Report, Severity

EVENTS = ("opened", "updated", "resolved", "report_ready", "approval_needed", "planned", "step_finished")

EVENT_LABELS = {
    "opened": "Incident opened",
    "updated": "Incident updated",
    "resolved": "Incident resolved",
    "report_ready": "Root-cause report ready",
    "approval_needed": "Approval needed",
    "planned": "Remediation planned",
    "step_finished": "Remediation step finished",
}
REOPENED_LABEL = "Incident reopened"

# Caps for the neutral message; channels cut further to their own limits.
TITLE_MAX = 150
SUMMARY_MAX = 2000
FIELD_MAX = 200
REPORT_SUMMARY_MAX = 1000
DIGEST_LISTED_MAX = 10  # items a digest lists; the rest are counted ("N more incidents")
STEPS_MAX = 6  # remediation steps a message lists; the rest are counted
STEP_TEXT_MAX = 300  # characters of what one step did or would do

# Work on at most this much of a hostile input: a 1 MB summary must not cost 1 MB of regex work per channel.
_INPUT_MAX = 8 * SUMMARY_MAX

_INVISIBLE = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f"  # C0/C1 controls except \t \n \r, which become spaces
    "\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180e"  # soft hyphen, invisible joiners and fillers
    "\u200b-\u200f\u202a-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb]"  # zero-width, bidi, word joiners, BOM
)
_SPACE = re.compile(r"\s+")
_MENTION = re.compile(r"@(?=(?:all|here|channel|everyone|所有人))", re.IGNORECASE)
_SCHEME = re.compile(r"(?i)\b([a-z][a-z0-9+.-]{1,20})://")
_WWW = re.compile(r"(?i)\bwww\.")
_WORD_JOINER = "\u2060"
_ZWSP = "\u200b"


def untrusted(text: Any, limit: int) -> str:
    """`text` made safe to show inside any channel's markup once that channel escapes its own specials."""
    value = "" if text is None else str(text)
    value = value[:_INPUT_MAX]
    value = _INVISIBLE.sub("", value)
    value = _SPACE.sub(" ", value).strip()
    value = _MENTION.sub("@" + _WORD_JOINER, value)
    value = _SCHEME.sub(lambda m: f"{m.group(1)}:/{_ZWSP}/", value)  # "http://x" -> "http:/\u200b/x"
    value = _WWW.sub("www" + _ZWSP + ".", value)
    return cut(value, limit)


def cut(text: str, limit: int) -> str:
    """At most `limit` characters, an ellipsis marking a cut."""
    if limit <= 0:
        return ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class ApprovalLink:
    """A proposed action waiting for a person: what it is and where to approve or reject it."""

    action_id: str
    kind: str
    target: str
    approve_url: str
    reject_url: str


@dataclass(frozen=True)
class StepLine:
    """One remediation step as a message tells it: `kind` and `status` trusted, `text` cleaned (untrusted)."""

    action_id: str
    kind: str
    status: str
    text: str

    def line(self, limit: int = STEP_TEXT_MAX) -> str:
        """"resubmit_job (dry run): would resubmit ...", its text cut to `limit` characters."""
        return f"{self.kind} ({self.status})" + (f": {cut(self.text, limit)}" if self.text and limit > 0 else "")


@dataclass(frozen=True)
class Message:
    event: str
    incident_id: str
    title: str
    severity: Severity
    category: str
    state: str
    summary: str
    job: str | None
    node: str | None
    owner: str | None
    incident_url: str | None
    report_url: str | None
    report_summary: str | None = None
    resolution: str | None = None  # a resolved incident's who and why ("by argus:stall: progress resumed")
    approvals: tuple[ApprovalLink, ...] = ()
    steps: tuple[StepLine, ...] = ()  # remediation's steps for the incident, at most STEPS_MAX
    steps_more: int = 0  # steps not listed
    occurrences: int = 1
    reopened: int = 0  # times the fault came back after the incident was resolved
    folded: int = 0  # a flapping incident's changes held back since its last message and told by this one
    incident: Incident | None = field(default=None, compare=False, repr=False)  # for the generic webhook

    @property
    def label(self) -> str:
        """What happened, in words: an update that reopened the incident says so."""
        return event_label(self.event, self.reopened, self.state)

    @property
    def history(self) -> str:
        """" · seen 3 times · reopened 2 times · 2 changes since the last message", or "" for a first sighting
        (trusted: counts only)."""
        parts = [f"seen {self.occurrences} times"] if self.occurrences > 1 else []
        if self.reopened:
            parts.append(f"reopened {self.reopened} time{'s' if self.reopened > 1 else ''}")
        if self.folded > 1:
            parts.append(f"{self.folded} changes since the last message")
        return "".join(f" · {p}" for p in parts)

    def telling(self, later: Message) -> Message:
        """This first message about an incident also telling what `later` (its report being ready, the steps that
        wait for approval, remediation's plan) came to say: one message in the group instead of four."""
        newer_steps = bool(later.steps)
        return replace(self, report_summary=later.report_summary or self.report_summary,
                       approvals=self.approvals + later.approvals,
                       steps=later.steps if newer_steps else self.steps,
                       steps_more=later.steps_more if newer_steps else self.steps_more)

    def folding(self, count: int) -> Message:
        """This message telling `count` changes of a flapping incident held back since the last message."""
        return replace(self, folded=count)


@dataclass(frozen=True)
class Digest:
    """Several messages for one channel: a storm or what the rate limit held back. `more` were not listed."""

    items: tuple[Message, ...]
    more: int
    list_url: str | None
    critical: int = 0  # of all, listed or not

    @property
    def total(self) -> int:
        return len(self.items) + self.more

    @property
    def severity(self) -> Severity:
        return max((m.severity for m in self.items), key=lambda s: s.rank, default=Severity.INFO)

    @property
    def title(self) -> str:
        extra = f", {self.critical} critical" if self.critical else ""
        return f"{self.total} incident notifications{extra}"


def links(public_url: str | None, incident_id: str) -> tuple[str | None, str | None]:
    """(incident link, report link) in the API, or (None, None) without a public URL."""
    if not public_url:
        return None, None
    base = f"{public_url.rstrip('/')}/v1/incidents/{quote(incident_id, safe='')}"
    return base, f"{base}/report?format=markdown"


def list_link(public_url: str | None) -> str | None:
    return f"{public_url.rstrip('/')}/v1/incidents?state=open" if public_url else None


def build_message(
    incident: Incident,
    event: str,
    *,
    report: Report | None = None,
    approvals: Sequence[ApprovalLink] | None = None,
    public_url: str | None = None,
    actions: Sequence[Action] = (),
) -> Message:
    """`actions`: remediation's steps for the incident, told one line each (`step_lines`)."""
    if event not in EVENTS:
        raise ValueError(f"unknown notification event {event!r}; one of {', '.join(EVENTS)}")
    impact = dict((report.data or {}).get("impact") or {}) if report is not None else {}
    incident_url, report_url = links(public_url, incident.id)
    # The incident's own attrs first, then what the report found in the job's folder (its JobSpec), named the
    # one way core.names spells it: the job by its submission id and JobSpec name, the node by name and IP.
    attrs = dict(incident.attrs or {})
    for key, value in ((keys.JOB_NAME, impact.get("job_name")), (keys.OWNER, impact.get("owner"))):
        if clean(attrs.get(key)) is None and value:
            attrs[key] = value
    named = Named(incident.subject, attrs)
    nodes = [str(n) for n in impact.get("nodes") or [] if n]
    job = job_of(named, with_owner=False) or (job_label(impact["job"]) if isinstance(impact.get("job"), str) else None)
    node = node_of(named) or (", ".join(nodes) if nodes else None)
    owner = clean(attrs.get(keys.OWNER))
    where = untrusted(label_of(named), 120)
    label = event_label(event, incident.reopened, incident.state.value)
    return Message(
        event=event,
        incident_id=incident.id,
        # "Argus" in every title: a bot set to accept only messages with a keyword can be given that one.
        title=cut(f"Argus · {label}: {incident.category.value} on {where}", TITLE_MAX),
        severity=incident.severity,
        category=incident.category.value,
        state=incident.state.value,
        summary=untrusted(incident.summary, SUMMARY_MAX),
        job=untrusted(job, FIELD_MAX) or None,
        node=untrusted(node, FIELD_MAX) or None,
        owner=untrusted(owner, FIELD_MAX) or None,
        incident_url=incident_url,
        report_url=report_url,  # before the report exists the API answers "not yet, retry": still the place
        report_summary=untrusted(report.summary, REPORT_SUMMARY_MAX) if report is not None else None,
        resolution=untrusted(incident.resolution, REPORT_SUMMARY_MAX) or None,
        approvals=tuple(_safe_approval(a) for a in approvals or () if _http(a.approve_url) and _http(a.reject_url)),
        steps=step_lines(actions),
        steps_more=max(0, len(actions) - STEPS_MAX),
        occurrences=incident.occurrences,
        reopened=incident.reopened,
        incident=incident,
    )


def event_label(event: str, reopened: int, state: str) -> str:
    """What happened, in words: an update that reopened the incident says so."""
    if event == "updated" and reopened and state == IncidentState.OPEN.value:
        return REOPENED_LABEL
    return EVENT_LABELS[event]


class LinkSigner(Protocol):
    """argus.approval_links.ApprovalLinks: signed, expiring approve/reject links."""

    def link(self, action_id: str, decision: Literal["approve", "reject"]) -> str: ...  # pragma: no cover


def approval_links_for(actions: Sequence[Action], signer: LinkSigner) -> list[ApprovalLink]:
    """The links a message offers for `actions` waiting on approval (a GET shows the step; its form decides)."""
    return [ApprovalLink(action_id=a.id, kind=a.kind, target=a.target.name or a.target.id,
                         approve_url=signer.link(a.id, "approve"), reject_url=signer.link(a.id, "reject"))
            for a in actions]


def step_lines(actions: Sequence[Action]) -> tuple[StepLine, ...]:
    """The first STEPS_MAX steps as message lines: what each did once it is final, else its preview (core.steps)."""
    lines = []
    for action in list(actions)[:STEPS_MAX]:
        step = said(action)
        lines.append(StepLine(action_id=untrusted(step.action_id, 64), kind=untrusted(step.kind, 64),
                              status=untrusted(step.status, 64), text=untrusted(step.text, STEP_TEXT_MAX)))
    return tuple(lines)


def _http(url: str) -> bool:
    return url.startswith(("http://", "https://")) and not any(c in url for c in " \t\r\n<>\"'`()[]")


def _safe_approval(a: ApprovalLink) -> ApprovalLink:
    return ApprovalLink(action_id=untrusted(a.action_id, 64), kind=untrusted(a.kind, 64),
                        target=untrusted(a.target, FIELD_MAX), approve_url=a.approve_url, reject_url=a.reject_url)


def digest_of(items: Sequence[Message], public_url: str | None, listed: int = DIGEST_LISTED_MAX) -> Digest:
    """Approvals first, then by severity (arrival order within one): what a person must act on is the last
    thing cut into "N more"."""
    order = sorted(items, key=lambda m: (m.event != "approval_needed", -m.severity.rank))
    critical = sum(1 for m in order if m.severity is Severity.CRITICAL)
    return Digest(items=tuple(order[:listed]), more=max(0, len(order) - listed), list_url=list_link(public_url),
                  critical=critical)
