"""A real local LLM: llama.cpp's llama-server with a small model, behind its OpenAI-compatible API.

RCA talks to any OpenAI-compatible server; tests and the demo point it at this one. `make llm`
(scripts/llm-setup.sh) builds the binary and fetches the pinned model into a cache outside the repo;
`llm_paths()` says whether both are there, so callers can skip or fail with a clear message instead of
starting a server that cannot work.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import httpx
from loguru import logger

from core.errors import ArgusError
from stage.localstack.service import HttpService

# Keep in step with MODEL_SHA256 in scripts/llm-setup.sh (a test compares them).
PINNED_MODEL_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
MODEL_FILE = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
MODEL_ALIAS = "qwen2.5-coder-1.5b"


class LlmNotInstalled(ArgusError):
    """The llama-server binary or the pinned model is not in the cache."""


def default_cache_dir() -> Path:
    """Where scripts/llm-setup.sh installs: $ARGUS_LLM_CACHE, else ~/.cache/argus/llm."""
    configured = os.environ.get("ARGUS_LLM_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "argus" / "llm"


@dataclass(frozen=True)
class LlmPaths:
    binary: Path
    model: Path
    present: bool
    problem: str | None = None  # why not present, for skip messages


def llm_paths(cache_dir: Path | None = None) -> LlmPaths:
    """The binary and model paths under `cache_dir` and whether both are installed.

    The model counts only with a `.sha256` stamp equal to the pin: the setup script writes that stamp
    after the joined file hashed to the pin, so it is trusted here rather than hashing 1.1 GB each time.
    """
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    binary = cache / "bin" / "llama-server"
    model = cache / "models" / MODEL_FILE
    stamp = model.with_name(model.name + ".sha256")
    problem = None
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        problem = f"no executable llama-server at {binary}"
    elif not model.is_file():
        problem = f"no model at {model}"
    elif not stamp.is_file():
        problem = f"no checksum stamp {stamp}: the model was never verified"
    else:
        recorded = stamp.read_text().strip()
        if recorded != PINNED_MODEL_SHA256:
            problem = f"checksum stamp {stamp} says {recorded[:16]}..., the pin is {PINNED_MODEL_SHA256[:16]}..."
    return LlmPaths(binary, model, problem is None, problem)


class LlamaServer(HttpService):
    """llama-server on a loopback port serving one model under `alias` at `base_url` (OpenAI API)."""

    _label = "llama-server"

    def __init__(
        self,
        work_dir: Path,
        *,
        binary: Path,
        model: Path,
        host: str = "127.0.0.1",
        port: int = 0,
        alias: str = MODEL_ALIAS,
        ctx_size: int = 8192,
        threads: int = 2,
        parallel: int = 1,
    ) -> None:
        super().__init__(work_dir, host=host, port=port)
        self.binary = Path(binary)
        self.model_path = Path(model)
        self.alias = alias
        self.ctx_size = ctx_size
        self.threads = threads
        self.parallel = parallel

    @property
    def base_url(self) -> str:
        """What an OpenAI client (langchain's ChatOpenAI) takes as base_url."""
        return f"{self.url}/v1"

    @property
    def model(self) -> str:
        """The model name clients send; the server answers to its alias, not the file name."""
        return self.alias

    @property
    def log_path(self) -> Path:
        return self.work_dir / "llama-server.log"

    def argv(self) -> list[str]:
        return [
            str(self.binary),
            "--model", str(self.model_path),
            "--alias", self.alias,
            "--host", self.host,
            "--port", str(self._port),
            "--ctx-size", str(self.ctx_size),
            "--threads", str(self.threads),
            "--parallel", str(self.parallel),
            "--no-webui",
            "--offline",  # never reach for a model hub: there is none on our machines
        ]

    def _ready(self) -> bool:
        # /health answers 503 while the model loads and 200 {"status": "ok"} once it can serve.
        resp = httpx.get(f"{self.url}/health", timeout=2)
        return resp.status_code == 200 and resp.json().get("status") == "ok"

    def start(self, timeout: float = 120.0) -> LlamaServer:
        if self._running():
            return self
        for what, path in (("llama-server binary", self.binary), ("model", self.model_path)):
            if not path.is_file():
                raise LlmNotInstalled(f"{what} {path} does not exist", hint="run `make llm` first")
        self._prepare()
        self._launch("llama-server", self.argv(), self.log_path, self._ready,
                     f"{self.url}/health to answer 200 with the model loaded", timeout)
        logger.info("llama-server up at {} serving {} as {!r}", self.base_url, self.model_path.name, self.alias)
        return self

    def log_paths(self) -> list[Path]:
        return [self.log_path]
