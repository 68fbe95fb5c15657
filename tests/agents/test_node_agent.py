"""Node agents (argus/agents) against a real central: the app `argus serve` runs, under uvicorn on a loopback port,
with a real SQLite store and tokens. The agent reads real files in a Ray-like log folder and a kernel log file; the
lines reach the Ray log collector as signals and the log rules as findings. A central restart loses nothing; a full
buffer stops the reading (back-pressure), a full inbox answers 429 and the agent keeps its batch."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest

from argus.agents.node_agent import NodeAgent
from argus.agents.scanner import NodeScanner
from argus.store.store import Store
from collectors.offsets import OffsetStore
from collectors.ray_logs import RayLogsCollector
from core import signal_keys as keys
from core.types import Category, SubjectKind
from detectors.engine import load_rules
from detectors.log_rules import LogRuleDetector
from stage.localstack.central import Central

RULES = load_rules()
XID = "[Thu Nov 26 11:59:58 2026] NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus."


def ray_logs(tmp_path: Path) -> Path:
    logs = tmp_path / "session" / "logs"
    logs.mkdir(parents=True)
    (logs / "raylet.out").write_text("[2026-11-26 11:00:00,000 I 1 1] raylet started\n")
    (logs / "job-driver-raysubmit_1.log").write_text("")
    (logs / "dashboard.log").write_text("not a file the agent reads\n")
    return logs


def agent_for(tmp_path: Path, url: str, token: str, **kw: Any) -> NodeAgent:
    ray_logs(tmp_path)
    kern = tmp_path / "kern.log"
    kern.touch()
    return NodeAgent(node_id="node-a", node_ip="10.0.0.7", central_url=url, token=token,
                     logs_dir=str(tmp_path / "session" / "logs"), kernel_log=str(kern), **{"interval_s": 0.1, **kw})


def test_the_scanner_sends_matches_with_their_context_and_progress_and_keeps_the_rest(tmp_path: Path) -> None:
    logs = ray_logs(tmp_path)
    scanner = NodeScanner(logs, OffsetStore(tmp_path / "o.json"), RULES)
    scanner.poll()  # the backlog
    driver = logs / "job-driver-raysubmit_1.log"
    driver.write_text("".join(f"node0:1:1 [0] NCCL INFO Channel {i:02d} : 0[0] -> 1[1] via P2P\n" for i in range(50))
                      + "step:12 - actor/loss:0.5\n"
                      + "loading batch 13\nforward pass\nbackward pass\n"
                      + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0)\n")
    picked = scanner.poll()
    assert [line.text.split()[0] for line in picked] == [
        "step:12", "loading", "forward", "backward", "torch.OutOfMemoryError:"]
    assert scanner.lines_read >= 55  # it read everything and sent five lines


def test_lines_read_on_a_node_reach_the_central_and_become_findings_about_that_node(
        tmp_path: Path, central: tuple[Central, str]) -> None:
    server, token = central
    agent = agent_for(tmp_path, server.url, token)
    agent.run_once()  # first sight: backlogs
    server.inbox.take()
    with (tmp_path / "kern.log").open("a") as f:
        f.write(XID + "\n")
    with (tmp_path / "session" / "logs" / "raylet.out").open("a") as f:
        f.write("[2026-11-26 12:00:01,000 E 1 1] Killed process 4242 (python) total-vm:81234kB\n")
    agent.run_once()
    assert agent.counters.lines_sent >= 2 and not agent.buffer
    collector = RayLogsCollector("http://127.0.0.1:9", OffsetStore(tmp_path / "c.json"))
    signals = collector.from_agents(server.inbox.take(), datetime.now(timezone.utc))
    by_stream = {s.attrs[keys.STREAM]: s for s in signals}
    assert set(by_stream) == {"kernel", "raylet"}
    assert by_stream["kernel"].subject.kind is SubjectKind.NODE and by_stream["kernel"].subject.id == "node-a"
    findings = LogRuleDetector(RULES).detect(signals)
    assert {f.category for f in findings} == {Category.GPU_HARDWARE, Category.HOST_OOM}
    assert server.inbox.covered() == {"node-a"}
    agent.stop()


def test_a_central_restart_loses_no_line_and_a_full_buffer_stops_the_reading(
        tmp_path: Path, central: tuple[Central, str]) -> None:
    server, token = central
    agent = agent_for(tmp_path, server.url, token, max_buffer_lines=4, heartbeat_s=0.0)
    agent.run_once()
    server.inbox.take()
    server.stop()
    raylet = tmp_path / "session" / "logs" / "raylet.out"
    with raylet.open("a") as f:
        for i in range(10):
            f.write(f"[2026-11-26 12:00:{i:02d},000 E 1 1] Killed process {100 + i} (python)\n")
    agent.run_once()
    assert agent.counters.send_failures == 1 and "cannot reach the central" in str(agent.counters.last_error)
    # one poll read the ten (the bound is checked before reading), with the line before the first as its context
    assert sum("Killed process" in line.text for line in agent.buffer) == 10
    agent._retry_at = float("-inf")  # the test does not wait out the back-off
    agent.run_once()
    assert agent.counters.paused_polls == 1  # full: it did not read, the file keeps what is new
    server.start()
    deadline = time.monotonic() + 20
    while agent.buffer and time.monotonic() < deadline:
        agent._retry_at = float("-inf")
        agent.run_once()
    texts = [line.text for batch in server.inbox.take() for line in batch.lines if "Killed process" in line.text]
    assert [t.split("process ")[1].split()[0] for t in texts] == [str(100 + i) for i in range(10)]
    agent.stop()


def test_a_burst_past_the_poll_budget_is_read_on_at_once_not_a_budget_an_interval(
        tmp_path: Path, central: tuple[Central, str]) -> None:
    server, token = central
    agent = agent_for(tmp_path, server.url, token, interval_s=60.0)
    agent.run_once()  # first sight of the files
    server.inbox.take()
    driver = tmp_path / "session" / "logs" / "job-driver-raysubmit_1.log"
    noise = "".join(f"node0:1:1 [0] NCCL INFO Channel {i:02d}/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n" for i in range(32))
    with driver.open("a") as f:
        for _ in range(30 * 1024 * 1024 // len(noise)):  # ~30 MB: four of the scanner's 8 MB file budgets
            f.write(noise)
        f.write("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0)\n")
    agent.start()  # polls at once, then every 60 s unless behind
    try:
        texts: list[str] = []
        deadline = time.monotonic() + 30
        while not any("OutOfMemoryError" in t for t in texts) and time.monotonic() < deadline:
            texts += [line.text for batch in server.inbox.take() for line in batch.lines]
            time.sleep(0.2)
        assert any("OutOfMemoryError" in t for t in texts), "the burst's last line did not arrive within 30 s"
        assert agent.counters.polls >= 4 and not agent.scanner.behind
    finally:
        agent.stop()


def test_a_full_inbox_answers_429_and_the_agent_keeps_the_batch(tmp_path: Path, central: tuple[Central, str]) -> None:
    server, token = central  # the inbox holds 50 lines
    body = {"node_id": "n1", "node_ip": "10.0.0.1",
            "lines": [{"file": "raylet.out", "line": i, "text": "x"} for i in range(40)]}
    headers = {"authorization": f"Bearer {token}"}
    assert httpx.post(f"{server.url}/v1/agents/batch", json=body, headers=headers).status_code == 200
    full = httpx.post(f"{server.url}/v1/agents/batch", json=body, headers=headers)
    assert full.status_code == 429 and full.headers["retry-after"] == "2"
    assert full.json()["error"] == "InboxFull"


@pytest.mark.parametrize("body", [
    {"node_id": "n1", "node_ip": "10.0.0.1", "lines": [{"file": "../../etc/passwd", "line": 1, "text": "x"}]},
    {"node_id": "n1", "node_ip": "10.0.0.1", "lines": [{"file": "raylet.out", "line": -1, "text": "x"}]},
    {"node_id": "n1", "node_ip": "not an ip; rm -rf", "lines": []},
    {"node_id": "", "node_ip": "10.0.0.1", "lines": []},
    {"node_id": "n1", "node_ip": "10.0.0.1", "lines": [{"file": "raylet.out", "line": 1, "text": "x" * 200_000}]},
    {"node_id": "n1", "node_ip": "10.0.0.1", "lines": [{"file": "raylet.out", "line": 1, "text": "x"}] * 10_001},
    {"node_id": "n1", "node_ip": "10.0.0.1", "surprise": 1},
    [1, 2, 3],
])
def test_hostile_batches_are_refused_with_a_clear_error_and_keep_nothing(
        tmp_path: Path, central: tuple[Central, str], body: Any) -> None:
    server, token = central
    answer = httpx.post(f"{server.url}/v1/agents/batch", json=body, headers={"authorization": f"Bearer {token}"},
                        timeout=30)
    assert answer.status_code in (413, 422), answer.text
    assert server.inbox.take() == []


def test_the_node_agent_token_only_sends_lines_and_only_it_may(tmp_path: Path, central: tuple[Central, str]) -> None:
    server, token = central
    assert httpx.get(f"{server.url}/v1/incidents", headers={"authorization": f"Bearer {token}"}).status_code == 403
    _, viewer = server.store.create_token("someone", "viewer", created_by="test")
    body = {"node_id": "n1", "node_ip": "10.0.0.1", "lines": []}
    assert httpx.post(f"{server.url}/v1/agents/batch", json=body,
                      headers={"authorization": f"Bearer {viewer}"}).status_code == 403
    assert httpx.post(f"{server.url}/v1/agents/batch", json=body).status_code == 401
    listed = httpx.get(f"{server.url}/v1/agents", headers={"authorization": f"Bearer {viewer}"}).json()
    assert listed == []  # an empty batch from n1 was refused, so nobody was heard


def test_the_agents_token_is_made_once_kept_private_and_made_again_when_revoked(tmp_path: Path) -> None:
    from argus.agents.fleet import TOKEN_FILE, agent_token

    store = Store(f"sqlite:///{tmp_path / 'argus.db'}")
    try:
        first = agent_token(store, tmp_path)
        assert agent_token(store, tmp_path) == first  # a restart keeps the agents' token valid
        assert (tmp_path / TOKEN_FILE).stat().st_mode & 0o777 == 0o600
        record = store.verify_token(first)
        assert record is not None and record.role.value == "node_agent"
        store.revoke_token(record.name)
        again = agent_token(store, tmp_path)
        assert again != first and store.verify_token(again) is not None
    finally:
        store.close()


@pytest.mark.parametrize("line", [
    "step:12 - actor/loss:0.5", "global_step=5", " iteration      120/    1000 | consumed samples: 9",
    "Epoch 1:  45%|####5     | 45/100 [00:10<00:12, 4.5it/s]", "{'loss': 0.52, 'learning_rate': 1e-05, 'epoch': 0.12}",
    "Step: 12", "[step #7]", "NCCL INFO Channel 01/0 : 0[0] -> 1[1]", "steps 12 done", "GET /step 1", "",
])
def test_one_combined_progress_regex_says_what_the_stall_detectors_patterns_say(line: str) -> None:
    import re

    from argus.agents.scanner import combined
    from detectors.stall import DEFAULT_PATTERNS

    one = combined(DEFAULT_PATTERNS)
    assert one is not None
    assert bool(one.search(line)) is any(re.search(p.pattern, line) for p in DEFAULT_PATTERNS)
