"""`argus analyze` through Typer's test runner and as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from argus.cli_analyze import register

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "logs"
NODE_LOST = FIXTURES / "node_lost" / "ray-2022_train_node_marked_dead.log"
OOM = FIXTURES / "other" / "verl-2025_cuda_oom.log"


def make_app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """A stand-in for the main CLI: a group, so `analyze` stays a subcommand."""

    register(app)
    return app


@pytest.fixture()
def runner() -> CliRunner:
    return CliRunner()


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_json_one_object_per_file(runner: CliRunner) -> None:
    result = runner.invoke(make_app(), ["analyze", "--json", str(NODE_LOST), str(OOM)])
    assert result.exit_code == 0, result.output
    first, second = json_lines(result.stdout)
    assert first["path"] == str(NODE_LOST) and first["category"] == "node_lost"
    assert first["evidence"][0]["line"] == 6
    assert second["path"] == str(OOM) and second["category"] != "node_lost"


def test_readable_output(runner: CliRunner) -> None:
    result = runner.invoke(make_app(), ["analyze", str(NODE_LOST)])
    assert result.exit_code == 0, result.output
    assert "node_lost" in result.stdout
    assert "confidence" in result.stdout and "What to do" in result.stdout
    assert "has been marked dead" in result.stdout


def test_stdin(runner: CliRunner) -> None:
    result = runner.invoke(make_app(), ["analyze", "--json", "-"], input=NODE_LOST.read_bytes())
    assert result.exit_code == 0, result.output
    (only,) = json_lines(result.stdout)
    assert only["path"] == "-" and only["category"] == "node_lost"


def test_missing_file_is_reported_and_the_rest_still_analyzed(runner: CliRunner, tmp_path: Path) -> None:
    missing = tmp_path / "no-such.log"
    result = runner.invoke(make_app(), ["analyze", "--json", str(missing), str(NODE_LOST), str(tmp_path)])
    assert result.exit_code == 2
    assert f"cannot read {missing}" in result.stderr
    assert f"cannot read {tmp_path}" in result.stderr
    assert "Traceback" not in result.output
    (only,) = json_lines(result.stdout)
    assert only["category"] == "node_lost"


def test_bad_rule_file_names_file_and_line(runner: CliRunner, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "source: job-logs\nrules:\n  - reason: Broken\n    category: node_lost\n    type: permanent\n"
        "    pattern: '(unclosed'\n",
        encoding="utf-8",
    )
    result = runner.invoke(make_app(), ["analyze", "--rules-dir", str(tmp_path), str(NODE_LOST)])
    assert result.exit_code == 2
    assert f"{bad}:6" in result.stderr and "bad regex" in result.stderr
    assert "Traceback" not in result.output
    assert result.stdout == ""


def test_extra_rules_take_part(runner: CliRunner, tmp_path: Path) -> None:
    (tmp_path / "oom.yaml").write_text(
        "source: job-logs\nrules:\n  - reason: TestCudaOom\n    category: gpu_oom\n    type: permanent\n"
        "    pattern: 'OutOfMemoryError: CUDA out of memory'\n    priority: 99\n    action: smaller micro-batch\n",
        encoding="utf-8",
    )
    result = runner.invoke(make_app(), ["analyze", "--json", "--rules-dir", str(tmp_path), str(OOM)])
    assert result.exit_code == 0, result.output
    (only,) = json_lines(result.stdout)
    assert only["category"] == "gpu_oom" and only["recommended_action"] == "smaller micro-batch"
    assert only["evidence"][0]["line"] == 13


SCRIPT = (
    "import typer\n"
    "from argus.cli_analyze import register\n"
    "app = typer.Typer()\n"
    "app.callback()(lambda: None)\n"
    "register(app)\n"
    "app()\n"
)


def run_cli(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, "analyze", *args],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        timeout=120,
        check=False,
    )


def test_subprocess_json_and_stdin(tmp_path: Path) -> None:
    done = run_cli("--json", str(NODE_LOST), "-", str(tmp_path / "missing.log"), stdin=OOM.read_bytes())
    assert done.returncode == 2, done.stderr.decode()
    results = json_lines(done.stdout.decode())
    assert [r["path"] for r in results] == [str(NODE_LOST), "-"]
    assert [r["category"] == "node_lost" for r in results] == [True, False]
    err = done.stderr.decode()
    assert "missing.log" in err and "Traceback" not in err


def test_subprocess_bad_rules_dir() -> None:
    done = run_cli("--rules-dir", "/nonexistent/rules", str(NODE_LOST))
    assert done.returncode == 2
    err = done.stderr.decode()
    assert "/nonexistent/rules" in err and "Traceback" not in err


# --- one failure, one report: --report and --llm ---------------------------------------------------

# A failure no rule reads: the program's own exception under frames whose header the excerpt lost (rules read a
# traceback's header, past Ray's prefix too, as a generic user_error).
QUIET = ["INFO step:41 - actor/loss:0.31",
         '(TaskRunner pid=7)   File "/app/trainer.py", line 88, in run', "(TaskRunner pid=7)     score(batch)",
         "(TaskRunner pid=7) rewards.Mismatch: invalid batch: the reward model returned 7 scores for 8 samples",
         "INFO bye"]


def test_report_reads_the_files_as_one_failure_and_prints_the_markdown(runner: CliRunner) -> None:
    result = runner.invoke(make_app(), ["analyze", "--report", str(NODE_LOST), str(OOM)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("# ") and "## Root cause" in result.stdout and "## Evidence" in result.stdout
    assert NODE_LOST.name in result.stdout and OOM.name in result.stdout  # both logs were read
    result = runner.invoke(make_app(), ["analyze", "--report", "--json", str(NODE_LOST)])
    [data] = json_lines(result.stdout)
    assert data["category"] == "node_lost" and data["llm"] is None and data["markdown"].startswith("# ")


def test_a_report_with_no_failure_counts_the_lines_it_read(runner: CliRunner, tmp_path: Path) -> None:
    healthy = tmp_path / "healthy.log"
    healthy.write_text("INFO step:1 - actor/loss:0.31\nINFO step:2 - actor/loss:0.29\nINFO bye\n")
    result = runner.invoke(make_app(), ["analyze", "--report", str(healthy)])
    assert result.exit_code == 0, result.output
    assert "No known failure signature was found in 3 lines." in result.stdout


def test_llm_without_a_server_says_how_to_name_one(runner: CliRunner, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARGUS_LLM_BASE_URL", raising=False)
    monkeypatch.setenv("ARGUS_DATA_DIR", str(tmp_path))
    result = runner.invoke(make_app(), ["analyze", "--llm", str(OOM)])
    assert result.exit_code == 2
    assert "--llm-url" in result.stderr and "ARGUS_LLM_BASE_URL" in result.stderr


def scripted_llm(category: str, refs: list[int]):  # type: ignore[no-untyped-def]
    """A real HTTP server on loopback that answers every chat completion with one scripted analysis: it stands for
    the LLM's answer so that what Argus does with it is checked exactly (the real model: tests/rca/test_llm_real)."""
    from tests.rca.test_llm_failures import completion, serve

    answer = {"category": category, "summary": "The reward model returned fewer scores than samples.",
              "root_cause": "The reward model returned 7 scores for 8 samples.", "timeline": [],
              "next_steps": [], "evidence_refs": refs, "confidence": 0.8}
    return serve(lambda: (200, completion(json.dumps(answer))))


def test_llm_category_stands_where_the_rules_found_nothing_and_is_capped(runner: CliRunner, tmp_path: Path) -> None:
    log = tmp_path / "driver.log"
    log.write_text("\n".join(QUIET) + "\n")
    servers = scripted_llm("user_error", [1, 2, 3, 4, 5, 6])
    url = next(servers)
    try:
        result = runner.invoke(make_app(), ["analyze", "--llm-url", url, "--json", str(log)])
    finally:
        servers.close()
    assert result.exit_code == 0, result.output
    [data] = json_lines(result.stdout)
    assert data["deterministic"]["category"] == "unknown"
    assert data["llm"]["ok"] and data["llm"]["accepted"], data["llm"]
    assert data["category"] == "user_error" and data["confidence"] <= 0.5
    assert any(e["why"].startswith("salient") for e in data["evidence"])


def test_llm_category_never_overrules_a_rule(runner: CliRunner) -> None:
    servers = scripted_llm("disk_full", [1])
    url = next(servers)
    try:
        result = runner.invoke(make_app(), ["analyze", "--llm-url", url, "--json", str(NODE_LOST)])
    finally:
        servers.close()
    [data] = json_lines(result.stdout)
    assert data["category"] == "node_lost" and not data["llm"]["accepted"] and "rejected" in data["llm"]["note"]


def test_llm_that_does_not_answer_leaves_the_rules_report(runner: CliRunner) -> None:
    from stage.localstack.ports import free_port

    result = runner.invoke(make_app(), ["analyze", "--llm-url", f"http://127.0.0.1:{free_port()}/v1", str(OOM)])
    assert result.exit_code == 0, result.output
    assert "gave no analysis" in result.stderr and "(deterministic)" in result.stdout
