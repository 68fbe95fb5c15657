"""Score root-cause analysis on the evaluation sets of real failure logs, fold by fold.

Folds (each a folder of NN_name/ cases, format in tests/rca_cases/README.md):
- dev: tests/rca_cases/, the cases the rules are tuned on;
- test: tests/rca_test/, cases split off at random when they were collected and never tuned on;
- holdout: tests/rca_holdout/, an earlier hold-out set, also never tuned on.
By default dev and test are scored, each on its own; `--fold` picks (repeatable), `--root` scores one folder.

For each fold it prints, with rich: accuracy per expected category, overall accuracy, the share of failure logs
called unknown (and how many of the logs called unknown, failing and healthy, have a failure word in them), the
confusion matrix (expected x predicted), the share of each case's facts found in the report (summary and evidence
lines), and the misses with the rule that won. `--json` prints the same as JSON.

Modes:
- rules: the classifier of `argus analyze`, each case's logs read in order as one stream;
- report: the full deterministic report of the RcaEngine (rca/offline.py: each log classified on its own, the
  first failure across them wins); facts are looked for in the whole Markdown report;
- llm: the same engine with the LLM writing the report. It prints both verdicts of the same reports, rules-only
  (the engine's deterministic verdict) and LLM-assisted (the report's category), and how often the LLM's own
  category was right, kept and rejected. With --llm-url it uses that server; otherwise it starts the local
  llama-server that `make llm` installed. Prints seconds per report as well.

    .venv/bin/python bench/rca_eval.py
    .venv/bin/python bench/rca_eval.py --mode llm [--limit 10]
    .venv/bin/python bench/rca_eval.py --fold holdout --json > rca_eval.json
    .venv/bin/python bench/rca_eval.py --mode llm --journal llm.jsonl   # cut short? run it again: it goes on

`--journal FILE` writes each case's result to FILE (JSON lines) as soon as it is scored, and takes the results
already there instead of scoring those cases again, as long as the rules, the code that reads them (core/,
detectors/, rca/ with its prompts) and the case's logs are the same bytes (each record carries their digest): a
two-hour LLM run on two cores can be done in pieces, and a run cut by a time limit keeps what it did.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.errors import ArgusError  # noqa: E402
from core.types import Category  # noqa: E402
from detectors.engine import builtin_rule_dir, load_rules  # noqa: E402
from rca.cases import Case, Prediction, Scores, evaluate, load_cases, rule_predictor  # noqa: E402
from rca.classify import TIER_WARNING  # noqa: E402

TESTS = Path(__file__).resolve().parents[1] / "tests"
FOLDS = {"dev": TESTS / "rca_cases", "test": TESTS / "rca_test", "holdout": TESTS / "rca_holdout"}
DEFAULT_FOLDS = ("dev", "test")


@dataclass
class Run:
    """What one fold's run saw besides the scores: seconds per report, and per case what the LLM said."""

    seconds: list[float] = field(default_factory=list)
    rules_only: dict[str, Category] = field(default_factory=dict)  # case -> the same report's deterministic verdict
    llm: list[dict[str, Any]] = field(default_factory=list)


# mode -> factory of a predictor; one explicit list, so a new mode is one line here.
PREDICTORS: dict[str, Callable[[argparse.Namespace, Run], Callable[[Case], Prediction]]] = {
    "rules": lambda args, run: rule_predictor(load_rules([])),
    "report": lambda args, run: report_predictor(None, run),
    "llm": lambda args, run: report_predictor(llm_writer(args), run, every_case=args.llm_every_case),
}


def report_predictor(writer, run: Run, *, every_case: bool = False):  # type: ignore[no-untyped-def]
    """The RcaEngine's report on a case presented as a failed job with an unknown cause (rca/offline.py). With a
    writer, the LLM is asked where its category could stand (the rules found no failure, or only warnings: see
    rca/verdict.py), or on every case with `every_case`; elsewhere the report is the rules' own, as it would be
    whatever the LLM answered."""
    from datetime import datetime, timezone

    from rca.engine import RcaEngine
    from rca.evidence import read_tail
    from rca.offline import report_logs
    from rca.redact import Redactor

    engine = RcaEngine(load_rules([]), Redactor, writer=writer)
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def predict(case: Case) -> Prediction:
        started = time.monotonic()
        logs = [read_tail(p, name=p.name) for p in case.logs]
        report = report_logs(engine, case.name, logs, at=at, use_llm=False)
        if writer is not None and (every_case or report.data["deterministic"]["tier"] <= TIER_WARNING):
            report = report_logs(engine, case.name, logs, at=at)
        run.seconds.append(time.monotonic() - started)
        run.rules_only[case.name] = Category(report.data["deterministic"]["category"])
        evidence = report.data.get("evidence") or []
        llm = report.data.get("llm") or {}
        if llm:
            run.llm.append({"case": case.name, "expected": case.category.value, "ok": llm.get("ok"),
                            "category": llm.get("category"), "accepted": llm.get("accepted"),
                            "rules": run.rules_only[case.name].value, "note": llm.get("note"),
                            "seconds": llm.get("seconds"), "confidence": llm.get("confidence"),
                            "cited": [e["text"] for e in evidence if e["ref"] in (llm.get("cited") or ())]})
        why = report.data.get("rule") or "-"
        if llm:
            why += f" / llm {llm.get('category') or 'failed'}: {'kept' if llm.get('accepted') else 'not used'}"
        return Prediction(category=report.category, text=report.markdown, reason=why,
                          first_evidence=evidence[0]["text"] if evidence else None)

    return predict


_SERVER: list[Any] = []
_WRITER: list[Any] = []


def llm_writer(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """One writer for every fold of the run (the local server starts once)."""
    if _WRITER:
        return _WRITER[0]
    import tempfile

    from rca.llm import LlmWriter

    if args.llm_url:
        _WRITER.append(LlmWriter(args.llm_url, args.llm_model, timeout_s=300, max_retries=0))
        return _WRITER[0]
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
    _WRITER.append(LlmWriter(server.base_url, server.model, timeout_s=300, max_retries=0))
    return _WRITER[0]


def llm_summary(run: Run) -> dict[str, float]:
    answered = [a for a in run.llm if a["ok"]]
    seconds = sorted(a["seconds"] for a in run.llm if a.get("seconds") is not None)
    kept = [a for a in answered if a["accepted"]]
    changed = [a for a in kept if a["category"] != a["rules"]]  # kept, and not merely agreeing with the rules
    return {
        "asked": len(run.llm), "answered": len(answered),
        "own_category_right": sum(a["category"] == a["expected"] for a in answered),
        "kept": len(kept), "kept_and_right": sum(a["category"] == a["expected"] for a in kept),
        "changed_the_category": len(changed),
        "changed_and_right": sum(a["category"] == a["expected"] for a in changed),
        "rejected": len(answered) - len(kept),
        "rejected_yet_right": sum(a["category"] == a["expected"] for a in answered if not a["accepted"]),
        "llm_seconds_median": seconds[len(seconds) // 2] if seconds else 0.0,
        "llm_seconds_max": seconds[-1] if seconds else 0.0,
    }


class Journal:
    """Each case's result as a JSON line, written when it is scored, and read back on the next run (see --journal)."""

    def __init__(self, path: Path, mode: str) -> None:
        self.path, self.mode = path, mode
        # What decides a verdict besides the logs: the rules, the code that reads them, the RCA and its prompts.
        root = builtin_rule_dir().parents[1]
        sources = sorted(p for d in ("core", "detectors", "rca") for p in (root / d).rglob("*")
                         if p.suffix in (".py", ".yaml", ".jinja2") and p.is_file())
        self.code = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).digest()
        self.kept: dict[tuple[str, str], dict[str, Any]] = {}
        if path.exists():
            lines = path.read_text(encoding="utf-8").splitlines()
            for number, line in enumerate(lines, start=1):
                try:
                    record = json.loads(line)
                    self.kept[(record["fold"], record["case"])] = record if record["mode"] == mode else {}
                except (ValueError, KeyError, TypeError) as exc:
                    if number == len(lines):  # a run killed while it wrote: dropped, that case is scored again
                        path.write_text("".join(f"{kept}\n" for kept in lines[:-1]), encoding="utf-8")
                        continue
                    raise SystemExit(f"{path}:{number}: not a journal record ({exc}); "
                                     "pass another --journal file or delete this one") from exc
        self.reused = 0

    def digest(self, case: Case) -> str:
        sha = hashlib.sha256(self.code)
        for log in case.logs:
            sha.update(log.read_bytes())
        return sha.hexdigest()[:24]

    def recall(self, fold: str, case: Case, digest: str, run: Run) -> Prediction | None:
        record = self.kept.get((fold, case.name))
        if not record or record.get("digest") != digest:
            return None
        if record.get("seconds") is not None:
            run.seconds.append(record["seconds"])
        if record.get("rules_only"):
            run.rules_only[case.name] = Category(record["rules_only"])
        if record.get("llm"):
            run.llm.append(record["llm"])
        self.reused += 1
        return Prediction(Category(record["category"]), record["text"], record.get("reason"),
                          record.get("first_evidence"))

    def write(self, fold: str, case: Case, digest: str, run: Run, prediction: Prediction,
              seconds: float | None) -> None:
        rules_only = run.rules_only.get(case.name)
        llm = run.llm[-1] if run.llm and run.llm[-1]["case"] == case.name else None
        record = {"mode": self.mode, "fold": fold, "case": case.name, "digest": digest,
                  "category": Category(prediction.category).value, "text": prediction.text,
                  "reason": prediction.reason, "first_evidence": prediction.first_evidence, "seconds": seconds,
                  "rules_only": rules_only.value if rules_only else None, "llm": llm}
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")


def score_fold(name: str, root: Path, args: argparse.Namespace, console: Console,
               journal: Journal | None = None) -> dict[str, Any] | None:
    try:
        cases = load_cases(root)
    except ArgusError as exc:
        console.print(f"[red]error:[/red] {exc.message}" + (f"\n[dim]{exc.hint}[/dim]" if exc.hint else ""))
        return None
    cases = cases[:: max(1, args.every)]
    cases = cases[: args.limit] if args.limit else cases
    run = Run()
    predict = PREDICTORS[args.mode](args, run)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"{name} ({args.mode}): {len(cases)} cases", total=len(cases))

        def counted(case: Case) -> Prediction:
            try:
                if journal is None:
                    return predict(case)
                digest = journal.digest(case)
                if (known := journal.recall(name, case, digest, run)) is not None:
                    return known
                timed = len(run.seconds)
                prediction = predict(case)
                journal.write(name, case, digest, run, prediction,
                              run.seconds[-1] if len(run.seconds) > timed else None)
                return prediction
            finally:
                progress.advance(task)

        scores = evaluate(cases, counted)
    result: dict[str, Any] = {"fold": name, "root": str(root), "scores": scores, "run": run,
                              "unknown_on_failures": scores.unknown_on_failures,
                              "unknown_profile": scores.unknown_profile()}
    if run.seconds:
        ordered = sorted(run.seconds)
        result["seconds_per_report_median"] = round(ordered[len(ordered) // 2], 2)
        result["seconds_per_report_max"] = round(ordered[-1], 2)
    if args.mode == "llm":
        result["rules_only"] = evaluate(cases, lambda c: Prediction(run.rules_only[c.name], ""))
        result["llm"] = llm_summary(run)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fold", action="append", choices=sorted(FOLDS), help="fold(s) to score (default: dev, test)")
    parser.add_argument("--root", type=Path, default=None, help="score this folder of NN_name/ cases instead")
    parser.add_argument("--mode", choices=sorted(PREDICTORS), default="rules", help="which predictor to score")
    parser.add_argument("--json", action="store_true", help="print the scores as JSON")
    parser.add_argument("--limit", type=int, default=None, help="only the first N cases of each fold")
    parser.add_argument("--every", type=int, default=1, help="every Nth case (a sample across all categories)")
    parser.add_argument("--llm-url", default=None, help="OpenAI-compatible base URL (default: start llama-server)")
    parser.add_argument("--llm-model", default="qwen2.5-coder-1.5b", help="model name for --llm-url")
    parser.add_argument("--llm-every-case", action="store_true",
                        help="ask the LLM on every case, not only where its category could stand")
    parser.add_argument("--journal", type=Path, default=None,
                        help="write each case's result to this JSON-lines file as it is scored, and reuse those "
                             "already there (same rules, same logs): a long run can be done in pieces")
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    folds = {args.root.name: args.root} if args.root else {f: FOLDS[f] for f in (args.fold or DEFAULT_FOLDS)}
    journal = Journal(args.journal, args.mode) if args.journal else None
    results = []
    try:
        for name, root in folds.items():
            result = score_fold(name, root, args, console, journal)
            if result is None:
                return 2
            results.append(result)
    finally:
        for server in _SERVER:
            server.stop()
    if journal is not None:
        console.print(f"journal {args.journal}: {journal.reused} case(s) taken from it, the rest scored and added",
                      soft_wrap=True)
    if args.json:
        print(json.dumps({"mode": args.mode, "folds": {r["fold"]: as_json(r) for r in results}}, indent=2))
        return 0
    out = Console()
    for result in results:
        show(result["scores"], f"{args.mode}, {result['fold']}", out)
        share = result["unknown_on_failures"]
        out.print(f"unknown on failure logs: {'n/a' if share is None else f'{share:.1%}'}")
        profile = result["unknown_profile"]
        out.print(f"called unknown: {profile['failures_called_unknown']} failure logs "
                  f"({profile['of_them_with_a_failure_word']} with a failure word in them) and "
                  f"{profile['healthy_called_unknown']} healthy logs ({profile['of_those_with_a_failure_word']} with "
                  "one)", soft_wrap=True)
        if "seconds_per_report_median" in result:
            out.print(f"seconds per report: median {result['seconds_per_report_median']}, "
                      f"max {result['seconds_per_report_max']}")
        if "llm" in result:
            t = result["llm"]
            out.print(f"[bold]{result['fold']}: rules-only {result['rules_only'].accuracy:.1%}, LLM-assisted "
                      f"{result['scores'].accuracy:.1%}[/bold] (the same {len(result['scores'].results)} reports)")
            out.print(f"LLM: answered {t['answered']}/{t['asked']}; its own category right in "
                      f"{t['own_category_right']}; "
                      f"kept {t['kept']} ({t['kept_and_right']} right; {t['changed_the_category']} changed the "
                      f"category, {t['changed_and_right']} of them rightly), rejected {t['rejected']} "
                      f"({t['rejected_yet_right']} of them right); seconds per LLM answer: median "
                      f"{t['llm_seconds_median']}, max {t['llm_seconds_max']}")
    if len(results) > 1:
        out.print("  ".join(f"{r['fold']}: {r['scores'].accuracy:.1%} of {len(r['scores'].results)}" for r in results))
    return 0


def as_json(result: dict[str, Any]) -> dict[str, Any]:
    data = {"root": result["root"], **result["scores"].to_dict(), "unknown_on_failures": result["unknown_on_failures"],
            "unknown_profile": result["unknown_profile"]}
    for key in ("seconds_per_report_median", "seconds_per_report_max", "llm"):
        if key in result:
            data[key] = result[key]
    if "rules_only" in result:
        data["rules_only_accuracy"] = round(result["rules_only"].accuracy, 4)
        data["llm_answers"] = result["run"].llm
    return data


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
        misses.add_row(  # log text is never markup: "[/opt/...pair.cc:598]" would be read as a closing tag
            Text(miss.case.name + (" (hard negative)" if miss.case.hard_negative else "")),
            miss.case.category.value,
            miss.predicted.value,
            Text(miss.reason or "-"),
            Text(line if len(line) <= 160 else line[:159] + "…"),
        )
    console.print(misses)


if __name__ == "__main__":
    sys.exit(main())
