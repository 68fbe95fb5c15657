"""The demo's live table: one row per fault, filled in from Argus's store as things happen."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from core.types import ActionState, Incident
from stage.demo.faults import Fault
from stage.demo.inject import Injection

_MARK = {ActionState.SUCCEEDED: "✓", ActionState.FAILED: "✗", ActionState.SKIPPED: "–",
         ActionState.REJECTED: "✗", ActionState.RUNNING: "…", ActionState.APPROVED: "…", ActionState.PLANNED: "?"}


@dataclass
class Row:
    fault: Fault
    injection: Injection | None = None
    incident: Incident | None = None
    actions: list[Any] = field(default_factory=list)
    reports: list[Any] = field(default_factory=list)
    report_file: Path | None = None
    error: str | None = None
    done: bool = False

    @property
    def detected_after(self) -> float | None:
        if self.incident is None or self.injection is None:
            return None
        return max(0.0, self.incident.detected_at.timestamp() - self.injection.at)

    @property
    def category_ok(self) -> bool:
        return self.incident is not None and self.incident.category is self.fault.expect

    def remediation(self) -> str:
        if not self.actions:
            return "—" if self.incident is None else "nothing planned"
        parts = []
        for a in self.actions:
            mark = _MARK.get(a.state, "?")
            text = f"{a.kind} {mark}"
            if a.state is ActionState.PLANNED and not a.dry_run:
                text = f"{a.kind}: waiting for approval"
            new = [j["new"] for j in a.result.get("jobs", []) if isinstance(j, dict) and isinstance(j.get("new"), str)]
            if a.kind == "resubmit_job" and new:
                text += " → " + ", ".join("…" + n[n.rfind("-"):] for n in new)  # the new id ends in -rN
            parts.append(text)
        return "\n".join(parts)

    def report(self) -> str:
        if self.incident is None:
            return "—"
        if not self.reports:
            return "writing…"
        if any(r.generator.startswith("llm") for r in self.reports):
            return f"{self.incident.id}\nrules + LLM"
        tried = [r.data["llm"] for r in self.reports if isinstance(r.data.get("llm"), dict)]
        if tried:  # the LLM's pass came back, but failed or was overruled by the evidence
            return f"{self.incident.id}\nrules (LLM {'failed' if not tried[-1].get('ok') else 'overruled'})"
        return f"{self.incident.id}\nrules"


def render(rows: list[Row], *, started: float, title: str) -> Table:
    table = Table(title=title, expand=True, show_lines=True)
    table.add_column("fault", no_wrap=True)
    table.add_column("fault at", justify="right", no_wrap=True)
    table.add_column("detected", justify="right", no_wrap=True)
    table.add_column("category", no_wrap=True)
    table.add_column("remediation", overflow="fold")
    table.add_column("incident, report", overflow="fold")
    for row in rows:
        fault = row.fault
        name = f"[bold]{fault.title}[/]" + ("\n[dim](simulated)[/]" if fault.simulated else "")
        injected = f"t+{row.injection.at - started:.0f}s" if row.injection else ("[red]failed[/]" if row.error
                                                                                    else "[dim]waiting[/]")
        if row.detected_after is not None:
            detected = f"+{row.detected_after:.1f}s"
        elif row.error:
            detected = "[red]✗[/]"
        else:
            detected = "[dim]…[/]" if row.injection else ""
        if row.incident is None:
            category = f"[dim]{fault.expect.value}?[/]"
        else:
            ok = "[green]✓[/]" if row.category_ok else f"[red]✗ expected {fault.expect.value}[/]"
            category = f"{row.incident.category.value} {ok}"
        report = row.report() if row.error is None else f"[red]{escape(row.error)}[/]"
        table.add_row(name, injected, detected, category, escape(row.remediation()), report)
    return table
