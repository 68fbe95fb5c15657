"""`argus analyze PATH...`: classify failed-job logs offline, one verdict per file; or, with `--report` or
`--llm`, the files as the logs of one failed job, through the same RcaEngine as an incident's report (the LLM
writing the narrative with `--llm`, its category standing only where the rules found no failure).

Registered on the main Typer app by `register(app)`; the command owns no state beyond the rule set.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from core.errors import ArgusError
from detectors.engine import RuleSet, load_rules
from rca.analyze import analyze_stream

if TYPE_CHECKING:
    from core.settings import Settings
    from rca.evidence import LogSource
    from rca.llm import LlmWriter

EXIT_INPUT_FAILED = 2
STDIN = "-"


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze)


def analyze(
    paths: list[str] = typer.Argument(..., metavar="PATH...", help="log files to classify; '-' reads stdin"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object per file, one per line"),
    rules_dirs: list[Path] = typer.Option(
        [], "--rules-dir", help="extra folder of *.yaml rule files (repeatable)", show_default=False
    ),
    report: bool = typer.Option(False, "--report", help="the files are one job's logs: print the full Markdown "
                                "report (with --json: the report's data and Markdown)"),
    llm: bool = typer.Option(False, "--llm", help="the files are one job's logs: an LLM writes the report's narrative "
                             "(ARGUS_LLM_BASE_URL, or --llm-url)"),
    llm_url: str | None = typer.Option(None, "--llm-url", help="OpenAI-compatible base URL of the LLM (implies --llm)"),
    llm_model: str | None = typer.Option(None, "--llm-model", help="the model name the LLM server knows"),
) -> None:
    """Classify failed-job logs: category, summary, evidence lines, confidence and what to do."""
    out = Console(soft_wrap=False)
    err = Console(stderr=True)
    try:
        rules = load_rules(rules_dirs)
    except ArgusError as exc:
        _error(err, exc.message, exc.hint)
        raise typer.Exit(EXIT_INPUT_FAILED) from None
    if report or llm or llm_url:
        _one_report(paths, rules, out, err, as_json=as_json, markdown=report, llm=bool(llm or llm_url),
                    llm_url=llm_url, llm_model=llm_model)
        return

    failed = False
    for path in paths:
        try:
            result = _analyze_one(path, rules)
        except OSError as exc:
            failed = True
            reason = exc.strerror or str(exc)
            _error(err, f"cannot read {path}: {reason}", "check the path and that you may read it")
            continue
        if as_json:
            sys.stdout.write(json.dumps(result, ensure_ascii=False) + "\n")
            sys.stdout.flush()
        else:
            _render(out, result)
    if failed:
        raise typer.Exit(EXIT_INPUT_FAILED)


def _analyze_one(path: str, rules: RuleSet) -> dict[str, Any]:
    if path == STDIN:
        return analyze_stream(STDIN, sys.stdin.buffer, rules)
    with open(path, "rb") as stream:
        return analyze_stream(path, stream, rules)


def _one_report(paths: list[str], rules: RuleSet, out: Console, err: Console, *, as_json: bool, markdown: bool,
                llm: bool, llm_url: str | None, llm_model: str | None) -> None:
    from rca.engine import RcaEngine
    from rca.offline import report_logs

    logs = []
    for path in paths:
        try:
            logs.append(_read(path))
        except OSError as exc:
            _error(err, f"cannot read {path}: {exc.strerror or exc}", "check the path and that you may read it")
            raise typer.Exit(EXIT_INPUT_FAILED) from None
    from argus.wiring import build_redactor
    from core.settings import load_settings

    try:
        settings = load_settings()
    except ArgusError as exc:
        _error(err, exc.message, exc.hint)
        raise typer.Exit(EXIT_INPUT_FAILED) from None
    writer = _llm_writer(err, settings, llm_url, llm_model) if llm else None
    engine = RcaEngine(rules, build_redactor(settings), writer=writer, token_budget=settings.rca_token_budget)
    name = Path(paths[0]).stem if paths[0] != STDIN else "stdin"
    if writer is not None:
        with err.status(f"the LLM ({writer.model}) is writing the report", spinner="dots"):
            result = report_logs(engine, name, logs)
    else:
        result = report_logs(engine, name, logs)
    llm_said = result.data.get("llm") or {}
    if llm and not llm_said.get("ok"):
        _error(err, f"the LLM gave no analysis ({llm_said.get('error') or 'no answer'}); the report is the rule "
               "engine's", "check --llm-url / ARGUS_LLM_BASE_URL and that the server answers")
    if as_json:
        data = {"paths": paths, "category": result.category.value, "confidence": result.confidence,
                "summary": result.summary, "generator": result.generator, "rule": result.data.get("rule"),
                "deterministic": result.data.get("deterministic"), "llm": result.data.get("llm"),
                "evidence": result.data.get("evidence"),
                "recommended_actions": result.data.get("recommended_actions")}
        if markdown:
            data["markdown"] = result.markdown
        sys.stdout.write(json.dumps(data, ensure_ascii=False, default=str) + "\n")
    elif markdown:
        sys.stdout.write(result.markdown)
    else:
        colour = "green" if result.category.value == "unknown" else "bold red"
        out.print(Text.assemble((result.category.value, colour), f"  confidence {result.confidence:.2f}",
                                f"  ({result.generator})"))
        out.print(result.summary, markup=False, highlight=False, soft_wrap=True)
        if llm_said.get("note"):
            out.print(Text.assemble(("LLM: ", "bold"), llm_said["note"]), highlight=False, soft_wrap=True)


def _read(path: str) -> LogSource:
    from rca.evidence import LogSource, read_tail

    if path == STDIN:
        from rca.analyze import iter_lines

        return LogSource(name="stdin", lines=list(iter_lines(sys.stdin.buffer)))
    with open(path, "rb"):  # read_tail turns an unreadable file into an empty log; here it is the user's error
        pass
    return read_tail(Path(path), name=path)


def _llm_writer(err: Console, settings: Settings, url: str | None, model: str | None) -> LlmWriter:
    from argus.wiring import build_llm

    updates = {key: value for key, value in (("llm_base_url", url), ("llm_model", model)) if value}
    writer = build_llm(settings.model_copy(update=updates))
    if writer is None:
        _error(err, "no LLM to ask: --llm needs a server", "pass --llm-url http://HOST:PORT/v1 or set "
               "ARGUS_LLM_BASE_URL (any OpenAI-compatible server: vLLM, llama-server, Ollama)")
        raise typer.Exit(EXIT_INPUT_FAILED)
    return writer


def _error(err: Console, message: str, hint: str | None) -> None:
    err.print(Text.assemble(("error: ", "bold red"), message), highlight=False, soft_wrap=True)
    if hint:
        err.print(f"  hint: {hint}", markup=False, highlight=False, soft_wrap=True)


def _render(out: Console, result: dict[str, Any]) -> None:
    colour = "green" if result["category"] == "unknown" else "bold red"
    out.rule(Text(result["path"], style="bold"), style="dim")
    out.print(Text.assemble((result["category"], colour), f"  confidence {result['confidence']:.2f}"))
    out.print(result["summary"], markup=False, highlight=False, soft_wrap=True)
    if result["evidence"]:
        table = Table(show_header=True, header_style="bold", expand=False, show_lines=False)
        table.add_column("line", justify="right", no_wrap=True)
        table.add_column("text", overflow="fold")
        for row in result["evidence"]:
            table.add_row(str(row["line"]), Text(row["text"]))
        out.print(table)
    if result["recommended_action"]:
        action = Text.assemble(("What to do: ", "bold"), result["recommended_action"])
        out.print(action, highlight=False, soft_wrap=True)
