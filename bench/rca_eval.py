"""Score root-cause analysis on the evaluation set of real failure logs (tests/rca_cases/).

Loads every case (rca.cases.load_cases), runs a predictor on it and prints, with rich: accuracy per expected
category, overall accuracy, the confusion matrix (expected x predicted), the share of each case's facts found in
the report (summary and evidence lines), and the misses with the rule that won. `--json` prints the same as JSON.

Modes:
- rules: the classifier of `argus analyze`, each case's logs read in order as one stream;
- report: the full deterministic report of the RcaEngine (each log classified on its own, the first failure
  across them wins); facts are looked for in the whole Markdown report;
- llm: the same engine with the LLM writing the report (the category still checked by the rules). With
  --llm-url it uses that server; otherwise it starts the local llama-server that `make llm` installed.
  Prints seconds per report as well.

    .venv/bin/python bench/rca_eval.py
    .venv/bin/python bench/rca_eval.py --mode llm [--limit 10]
    .venv/bin/python bench/rca_eval.py --json > rca_eval.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.errors import ArgusError  # noqa: E402
from core.types import Category  # noqa: E402
from detectors.engine import load_rules  # noqa: E402
from rca.cases import Case, Prediction, Scores, evaluate, load_cases, rule_predictor  # noqa: E402

DEFAULT_ROOT = Path(__file__).resolve().parents[1] / "tests" / "rca_cases"
# mode -> factory of a predictor; one explicit list, so a new mode is one line here.
PREDICTORS: dict[str, Callable[[argparse.Namespace], Callable[[Case], Prediction]]] = {
    "rules": lambda args: rule_predictor(load_rules([])),
    "report": lambda args: report_predictor(None),
    "llm": lambda args: report_predictor(llm_writer(args)),
}
SECONDS: list[float] = []
LLM_ANSWERS: list[dict] = []  # per case: the LLM's own category, whether it answered and whether it was kept


def report_predictor(writer):  # type: ignore[no-untyped-def]
    """The RcaEngine's report on a case presented as a failed job with an unknown cause."""
    from datetime import datetime, timezone

    from core.types import Evidence, Finding, Incident, IncidentState, Severity, Subject, SubjectKind
    from rca.engine import RcaEngine
    from rca.evidence import read_tail
    from rca.redact import Redactor

    engine = RcaEngine(load_rules([]), Redactor, writer=writer)
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def predict(case: Case) -> Prediction:
        subject = Subject(kind=SubjectKind.JOB, id=case.name)
        incident = Incident(id=f"inc-{case.name[:2]}", fingerprint=case.name, category=Category.UNKNOWN,
                            subject=subject, state=IncidentState.OPEN, severity=Severity.CRITICAL,
                            summary=f"job {case.name} failed", reason="JobFailed", first_seen=at, last_seen=at,
                            detected_at=at)
        finding = Finding(category=Category.UNKNOWN, reason="JobFailed", subject=subject, summary="job failed",
                          severity=Severity.CRITICAL, evidence=(Evidence(source="ray.jobs", text="FAILED"),),
                          first_seen=at)
        started = time.monotonic()
        report = engine.report(incident, [finding], [read_tail(p, name=p.name) for p in case.logs])
        SECONDS.append(time.monotonic() - started)
        evidence = report.data.get("evidence") or []
        llm = report.data.get("llm") or {}
        if llm:
            LLM_ANSWERS.append({"case": case.name, "expected": case.category.value, "ok": llm.get("ok"),
                                "category": llm.get("category"), "accepted": llm.get("accepted")})
        why = report.data.get("rule") or "-"
        if llm:
            why += f" / llm {llm.get('category') or 'failed'}: {'kept' if llm.get('accepted') else 'not used'}"
        return Prediction(category=report.category, text=report.markdown, reason=why,
                          first_evidence=evidence[0]["text"] if evidence else None)

    return predict


_SERVER = []


def llm_writer(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    import tempfile

    from rca.llm import LlmWriter

    if args.llm_url:
        return LlmWriter(args.llm_url, args.llm_model, timeout_s=300, max_retries=0)
    from stage.localstack.llm import LlamaServer, llm_paths
    from stage.localstack.process import REGISTRY, install_exit_handlers

    install_exit_handlers()  # a killed benchmark must not leave its server behind
    paths = llm_paths()
    if not paths.present:
        raise SystemExit(f"no local LLM: {paths.problem}; run `make llm` or pass --llm-url")
    server = LlamaServer(Path(tempfile.mkdtemp(prefix="ag-llm-")), binary=paths.binary, model=paths.model)
    REGISTRY.add(server)
    server.start(timeout=300)
    _SERVER.append(server)
    return LlmWriter(server.base_url, server.model, timeout_s=300, max_retries=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="folder of NN_name/ case folders")
    parser.add_argument("--mode", choices=sorted(PREDICTORS), default="rules", help="which predictor to score")
    parser.add_argument("--json", action="store_true", help="print the scores as JSON")
    parser.add_argument("--limit", type=int, default=None, help="only the first N cases")
    parser.add_argument("--every", type=int, default=1, help="every Nth case (a sample across all categories)")
    parser.add_argument("--llm-url", default=None, help="OpenAI-compatible base URL (default: start llama-server)")
    parser.add_argument("--llm-model", default="qwen2.5-coder-1.5b", help="model name for --llm-url")
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    try:
        cases = load_cases(args.root)
    except ArgusError as exc:
        console.print(f"[red]error:[/red] {exc.message}" + (f"\n[dim]{exc.hint}[/dim]" if exc.hint else ""))
        return 2
    cases = cases[:: max(1, args.every)]
    cases = cases[: args.limit] if args.limit else cases
    try:
        predict = PREDICTORS[args.mode](args)
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task(f"{args.mode}: {len(cases)} cases", total=len(cases))

            def counted(case: Case) -> Prediction:
                try:
                    return predict(case)
                finally:
                    progress.advance(task)

            scores = evaluate(cases, counted)
    finally:
        for server in _SERVER:
            server.stop()
    timing = {}
    if SECONDS:
        ordered = sorted(SECONDS)
        timing = {"seconds_per_report_median": round(ordered[len(ordered) // 2], 2),
                  "seconds_per_report_max": round(ordered[-1], 2)}
    if LLM_ANSWERS:
        answered = [a for a in LLM_ANSWERS if a["ok"]]
        timing["llm"] = {
            "answered": len(answered), "asked": len(LLM_ANSWERS),
            "own_category_right": sum(a["category"] == a["expected"] for a in answered),
            "kept": sum(bool(a["accepted"]) for a in answered),
            "rejected": sum(not a["accepted"] for a in answered),
        }
    if args.json:
        print(json.dumps({"mode": args.mode, **timing, **scores.to_dict(), "llm_answers": LLM_ANSWERS}, indent=2))
    else:
        show(scores, args.mode, Console())
        if SECONDS:
            Console().print(f"seconds per report: median {timing['seconds_per_report_median']}, "
                            f"max {timing['seconds_per_report_max']}")
        if "llm" in timing:
            t = timing["llm"]
            Console().print(f"LLM: answered {t['answered']}/{t['asked']}; its own category right in "
                            f"{t['own_category_right']}; kept {t['kept']}, rejected {t['rejected']}")
    return 0


def show(scores: Scores, mode: str, console: Console) -> None:
    per_category = Table(title=f"RCA accuracy per category ({mode}, {len(scores.results)} cases)")
    for column in ("category", "correct", "cases", "accuracy"):
        per_category.add_column(column, justify="left" if column == "category" else "right")
    for category, score in scores.per_category().items():
        per_category.add_row(category.value, str(score.correct), str(score.total), f"{score.accuracy:.0%}")
    console.print(per_category)

    facts = scores.facts_covered
    console.print(
        f"overall accuracy: [bold]{scores.accuracy:.1%}[/bold]   "
        f"facts covered: [bold]{'n/a' if facts is None else f'{facts:.1%}'}[/bold]"
    )

    confusion = scores.confusion()
    predicted = [c for c in Category if any(c in row for row in confusion.values())]
    matrix = Table(title="confusion matrix (rows: expected, columns: predicted)")
    matrix.add_column("expected")
    for category in predicted:
        matrix.add_column(category.value, justify="right")
    for expected, row in confusion.items():
        cells = []
        for category in predicted:
            n = row.get(category, 0)
            cells.append("" if n == 0 else f"[green]{n}[/green]" if category is expected else f"[red]{n}[/red]")
        matrix.add_row(expected.value, *cells)
    console.print(matrix)

    misses = Table(title=f"misses ({len(scores.misses)})")
    for column in ("case", "expected", "predicted", "winning reason", "first evidence line"):
        misses.add_column(column, overflow="fold")
    for miss in scores.misses:
        line = miss.first_evidence or ""
        misses.add_row(
            miss.case.name + (" (hard negative)" if miss.case.hard_negative else ""),
            miss.case.category.value,
            miss.predicted.value,
            miss.reason or "-",
            line if len(line) <= 160 else line[:159] + "…",
        )
    console.print(misses)


if __name__ == "__main__":
    sys.exit(main())
