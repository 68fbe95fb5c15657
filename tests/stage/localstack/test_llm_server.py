"""The real llama-server with the pinned model (installed by `make llm`), and the install check."""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import time
from pathlib import Path

import httpx
import psutil
import pytest

from stage.localstack.llm import MODEL_ALIAS, PINNED_MODEL_SHA256, LlamaServer, LlmNotInstalled, llm_paths
from stage.localstack.process import REGISTRY, is_alive

ROOT = Path(__file__).resolve().parents[3]
SETUP_SCRIPT = ROOT / "scripts" / "llm-setup.sh"

# A real CUDA OOM line, from zihaosheng/VLM-RL#12.
OOM_LINE = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 258.00 MiB (GPU 0; 23.54 GiB total "
    "capacity; 11.75 GiB already allocated; 572.50 MiB free; 12.40 GiB reserved in total by PyTorch) If reserved "
    "memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for "
    "Memory Management and PYTORCH_CUDA_ALLOC_CONF"
)

VERDICT_SCHEMA = {
    "type": "object",
    "properties": {
        "category": {"type": "string", "enum": ["gpu_oom", "host_oom", "nccl_hang", "user_error", "unknown"]},
        "summary": {"type": "string", "maxLength": 200},
    },
    "required": ["category", "summary"],
    "additionalProperties": False,
}


def _listening(port: int) -> bool:
    return any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
               for c in psutil.net_connections(kind="tcp"))


def _server_can_bind(host: str, port: int) -> bool:
    # With SO_REUSEADDR, as servers (llama-server too) bind: the closed connections of the stopped server
    # stay in TIME_WAIT for a minute, and only a bind without it would trip over them.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen()
        except OSError:
            return False
    return True


def _chat(server: LlamaServer, payload: dict, timeout: float = 120) -> dict:
    body = {"model": server.model, "temperature": 0, "seed": 1, **payload}
    resp = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=timeout)
    assert resp.status_code == 200, resp.text
    return resp.json()


# -- against the real server -----------------------------------------------------------------------


def test_health_is_ok(llm_server):
    resp = httpx.get(f"{llm_server.url}/health", timeout=10)
    assert resp.status_code == 200
    assert resp.json()["status"] == "ok"
    assert llm_server.base_url == f"http://127.0.0.1:{llm_server.port}/v1"


def test_chat_completion_returns_text(llm_server):
    out = _chat(llm_server, {
        "messages": [{"role": "user", "content": "Name the GPU vendor that makes CUDA. One word."}],
        "max_tokens": 16,
    })
    text = out["choices"][0]["message"]["content"]
    assert isinstance(text, str) and text.strip()
    assert out["model"] == MODEL_ALIAS
    assert out["usage"]["completion_tokens"] > 0


def test_json_schema_response_format_returns_matching_json(llm_server):
    started = time.monotonic()
    out = _chat(llm_server, {
        "messages": [
            {"role": "system", "content": "You classify failures of GPU training jobs. Answer in JSON."},
            {"role": "user", "content": f"Classify this job log line:\n{OOM_LINE}"},
        ],
        "max_tokens": 120,
        "response_format": {"type": "json_schema", "json_schema": {"name": "verdict", "schema": VERDICT_SCHEMA}},
    })
    elapsed = time.monotonic() - started
    verdict = json.loads(out["choices"][0]["message"]["content"])
    assert set(verdict) == {"category", "summary"}
    assert verdict["category"] in VERDICT_SCHEMA["properties"]["category"]["enum"]
    assert isinstance(verdict["summary"], str) and len(verdict["summary"]) <= 200
    print(f"structured call took {elapsed:.1f} s: {verdict}")


def test_stop_frees_the_port_and_leaves_no_process(llm_server, tmp_workdir):
    # A second server of its own: stopping the session one would break the tests after this.
    paths = llm_paths()
    server = LlamaServer(tmp_workdir / "llm", binary=paths.binary, model=paths.model).start(timeout=180)
    port = server.port
    pids = server.process.pids()
    assert pids and all(is_alive(p) for p in pids)
    assert _listening(port) and not _server_can_bind(server.host, port)
    server.stop()
    assert [p for p in pids if is_alive(p)] == []
    assert not _listening(port) and _server_can_bind(server.host, port)
    assert server not in REGISTRY.items() and server.process not in REGISTRY.items()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/health", timeout=2)


# -- no server needed ------------------------------------------------------------------------------


def _fake_install(cache: Path, stamp: str | None) -> None:
    binary = cache / "bin" / "llama-server"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    model = cache / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    model.parent.mkdir(parents=True)
    model.write_bytes(b"GGUF")
    if stamp is not None:
        model.with_name(model.name + ".sha256").write_text(stamp + "\n")


def test_llm_paths_reports_an_empty_cache_absent(tmp_path):
    paths = llm_paths(tmp_path)
    assert not paths.present
    assert paths.binary == tmp_path / "bin" / "llama-server"
    assert paths.model == tmp_path / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    assert "llama-server" in paths.problem


def test_llm_paths_rejects_a_stamp_that_differs_from_the_pin(tmp_path):
    _fake_install(tmp_path, "0" * 64)
    paths = llm_paths(tmp_path)
    assert not paths.present
    assert "checksum stamp" in paths.problem


def test_llm_paths_rejects_a_model_without_stamp_and_accepts_the_pinned_one(tmp_path):
    _fake_install(tmp_path / "a", None)
    assert not llm_paths(tmp_path / "a").present
    _fake_install(tmp_path / "b", PINNED_MODEL_SHA256)
    assert llm_paths(tmp_path / "b").present


def test_llm_paths_follows_the_cache_env_var(tmp_path, monkeypatch):
    _fake_install(tmp_path, PINNED_MODEL_SHA256)
    monkeypatch.setenv("ARGUS_LLM_CACHE", str(tmp_path))
    assert llm_paths().present


def test_setup_script_and_module_pin_the_same_model():
    pinned = re.search(r"^MODEL_SHA256=([0-9a-f]{64})$", SETUP_SCRIPT.read_text(), re.M)
    assert pinned is not None and pinned.group(1) == PINNED_MODEL_SHA256


def test_setup_script_check_names_what_is_missing(tmp_path):
    done = subprocess.run(["bash", str(SETUP_SCRIPT), "--check"], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "ARGUS_LLM_CACHE": str(tmp_path)})
    assert done.returncode == 1
    assert str(tmp_path / "bin" / "llama-server") in done.stdout
    assert "make llm" in done.stdout
    assert not (tmp_path / "bin").exists()  # --check only looks


def test_start_without_binary_says_to_run_make_llm(tmp_path):
    server = LlamaServer(tmp_path, binary=tmp_path / "nope" / "llama-server", model=tmp_path / "m.gguf")
    with pytest.raises(LlmNotInstalled) as info:
        server.start()
    assert "make llm" in str(info.value) and str(tmp_path / "nope" / "llama-server") in str(info.value)
