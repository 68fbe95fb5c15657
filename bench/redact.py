"""Redaction throughput: rca.redact.Redactor over a realistic training log, and over hostile input.

Generates (or takes, --file) a training-job log from a fixed seed: verl step metrics, vLLM, Ray core-worker,
NCCL and nvidia-smi lines as they appear in real jobs (shapes from verl-project/verl#1208, gpustack/gpustack#2732,
influxdata/telegraf#5812), every line of the real log fixtures (tests/fixtures/logs), and, one line in
SECRET_EVERY, a line carrying a secret in a shape seen in public issue threads (wandb login, WANDB_API_KEY=,
Authorization: Bearer, DSNs, clone URLs with tokens, webhooks, service-account keys, JWTs). The secrets are
made up here, from the seed, in each provider's documented shape.

Prints MB/s for one `redact` call over the whole log, for 1 MB chunks, line by line (on a slice), with IP and
user pseudonyms on, and seconds per MB for hostile inputs. Also checks what it times: every planted secret
must be gone and every other line byte-identical. Goal: > 20 MB/s. Not a test (timings vary with load).

    .venv/bin/python bench/redact.py                  # 50 MB generated log
    .venv/bin/python bench/redact.py --mb 200 --runs 3
    .venv/bin/python bench/redact.py --file /path/to/job.log
"""

from __future__ import annotations

import argparse
import random
import string
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rca.redact import Redactor  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "logs"
SECRET_EVERY = 2000  # one line in this many carries a secret
MB = 1024 * 1024

_NOISE = [
    "(TaskRunner pid={p}) step:{s} - global_seqlen/min:538646.000 - actor/kl_loss:0.001 - actor/entropy_loss:0.554 - "
    "actor/pg_loss:{f:.4f} - actor/grad_norm:{h:.3f} - perf/mfu/actor:1.018 - perf/max_memory_allocated_gb:25.921 - "
    "critic/score/mean:0.011 - response_length/mean:324.958 - response_length/clip_ratio:0.004 - "
    "prompt_length/mean:102.534 - timing_s/gen:{t:.3f} - timing_per_token_ms/gen:0.359 - perf/total_num_tokens:{n}51 - "
    "perf/throughput:{t:.2f}",
    "(WorkerDict pid={p}, ip=10.95.143.{n}) INFO 08-14 09:31:{c:02d} [serving_chat.py:125] Using default chat "
    "sampling params from model: {{'temperature': 0.7, 'top_k': 20, 'top_p': 0.8, 'max_tokens': 512}}",
    "(WorkerDict pid={p}, ip=10.95.143.{n}) INFO 08-14 09:31:{c:02d} [core.py:172] init engine (profile, create kv "
    "cache, warmup model) took {t:.2f} seconds",
    "(WorkerDict pid={p}, ip=10.95.143.{n}) [rank{c}]:[W402 15:02:{c:02d}.776885251 ProcessGroupNCCL.cpp:4561] [PG "
    "ID 0 PG GUID 0 Rank {c}] using GPU {c} to perform barrier as devices used by this process are currently unknown.",
    "worker-{n}:3018453:3024011 [{c}] NCCL INFO Channel {c:02d}/0 : 2[1040] -> 0[1020] via P2P/IPC/read",
    "[2025-04-02 15:02:{c:02d},117 I 135782 135790] accessor.cc:611: Received notification for node id = "
    "2ec03b7f681a8bef6ffa0e368c13890542e6f29eaa380cf400{p:08x}, IsAlive = 1",
    "GPU {c}: NVIDIA A100-SXM4-80GB (UUID: GPU-513536b6-7d19-9063-b049-1e6966{p:06x})",
    "Training Progress:  {c}%|██████▍         | {s}/3200 [08:56<02:05,  {t:.2f}s/it]",
    "(WorkerDict pid={p}) The tokenizer has new PAD/BOS/EOS tokens that differ from the model config. Updated tokens: "
    "{{'eos_token_id': 151645, 'bos_token_id': None, 'pad_token_id': 151643}}.",
    "(raylet) [2025-04-02 15:02:{c:02d},241 I 1111013 1111013] (raylet) local_object_manager.cc:490: Spilled {s} "
    "MiB, {c} objects, write throughput {n} MiB/s.",
    "(main_task pid={p}) wandb: Using wandb-core as the SDK backend.  Please refer to https://wandb.me/wandb-core",
    "(TaskRunner pid={p}) [validate_config] All configuration checks passed successfully! tokenizer=/mnt/shared/"
    "common/models/Qwen2.5-7B-Instruct max_prompt_length=512 max_response_length=1024",
]


def _rand(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _secret_line(rng: random.Random) -> tuple[str, str]:
    """A line carrying a made-up secret, and the secret."""
    alnum = string.ascii_letters + string.digits
    hexd = "0123456789abcdef"
    kind = rng.randrange(10)
    if kind == 0:
        secret = _rand(rng, hexd, 40)
        return f"+ wandb login {secret}", secret
    if kind == 1:
        secret = _rand(rng, hexd, 40)
        return f"+ export WANDB_API_KEY={secret}", secret
    if kind == 2:
        secret = "sk-proj-" + _rand(rng, alnum, 48)
        return f"Authorization: Bearer {secret}", secret
    if kind == 3:
        secret = _rand(rng, alnum, 20)
        return f"Engine(postgresql+psycopg2://argus:{secret}@10.0.3.7/argus)", secret
    if kind == 4:
        secret = "ghp_" + _rand(rng, alnum, 36)
        return f"+ git clone https://oauth2:{secret}@github.com/org/recipes.git", secret
    if kind == 5:
        secret = _rand(rng, hexd, 64)
        return f"POST https://oapi.dingtalk.com/robot/send?access_token={secret} -> 200", secret
    if kind == 6:
        secret = "hf_" + _rand(rng, string.ascii_letters, 34)
        env = f"{{'env_vars': {{'HF_TOKEN': '{secret}', 'NCCL_DEBUG': 'INFO'}}}}"
        return f"(TaskRunner pid=1) runtime_env={env}", secret
    if kind == 7:
        secret = _rand(rng, alnum + "+/", 40)
        return f"aws_secret_access_key = {secret}", secret
    if kind == 8:
        body = _rand(rng, alnum + "+/", 64)
        secret = f"-----BEGIN PRIVATE KEY-----\\n{body}\\n-----END PRIVATE KEY-----\\n"
        return f'  "private_key": "{secret}",', body
    header = "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9"
    secret = f"{header}.eyJ{_rand(rng, alnum, 60)}.{_rand(rng, alnum + '-_', 43)}"
    return f'[INF] Failed to validate the token "{secret}".', secret


def fixture_lines() -> list[str]:
    return [
        line
        for path in sorted(FIXTURES.glob("*/*.log"))
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]


def generate(megabytes: int, seed: int) -> tuple[list[str], dict[int, str]]:
    """The log's lines and {line number: planted secret}."""
    rng = random.Random(seed)
    real = fixture_lines()
    lines: list[str] = []
    planted: dict[int, str] = {}
    size, target = 0, megabytes * MB
    while size < target:
        roll = rng.randrange(SECRET_EVERY)
        if roll == 0:
            line, secret = _secret_line(rng)
            planted[len(lines)] = secret
        elif roll < SECRET_EVERY // 20:
            line = rng.choice(real)
        else:
            line = rng.choice(_NOISE).format(
                p=rng.randint(1000, 3_999_999),
                s=rng.randint(0, 99_999),
                f=rng.random(),
                h=rng.random() * 10,
                t=rng.random() * 100,
                n=rng.randint(1, 254),
                c=rng.randint(0, 7),
            )
        lines.append(line)
        size += len(line.encode("utf-8")) + 1
    return lines, planted


def best_of(runs: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(runs):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def chunks(text: str, size: int) -> list[str]:
    out, start = [], 0
    while start < len(text):
        end = text.find("\n", start + size)
        end = len(text) if end < 0 else end + 1
        out.append(text[start:end])
        start = end
    return out


def hostile() -> dict[str, str]:
    return {
        "a= repeated (1 MB line)": "a=" * (MB // 2),
        "base64 run": "QUJDRGVmZ2g0NTY3" * (MB // 16),
        "sk- then base64": "sk-" + "QUJDRGVmZ2g0NTY3" * (MB // 16),
        "nested quotes": "password=\"'" * (MB // 12),
        "unclosed quote": 'api_key="' + "a" * MB,
        "token= repeated": "token=" * (MB // 6),
        "--flag repeated": "--a" * (MB // 3),
        "dashes": "-" * MB,
        "BEGIN without END": "-----BEGIN PRIVATE KEY-----\n" + "QUJD\n" * (MB // 5),
        "URL with @@@": "://a:" + "@" * MB,
        "NUL and surrogates": "\x00password=\ud800" * (MB // 11),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=50, help="size of the generated log (default 50)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--file", type=Path, help="redact this log instead of generating one (no checks)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs; the best counts")
    parser.add_argument("--line-slice-mb", type=int, default=5, help="size of the slice redacted line by line")
    args = parser.parse_args()

    if args.file:
        text = args.file.read_text(encoding="utf-8", errors="surrogateescape")
        lines, planted = text.split("\n"), {}
    else:
        print(f"generating a {args.mb} MB log (seed {args.seed}) ...", flush=True)
        lines, planted = generate(args.mb, args.seed)
        text = "\n".join(lines) + "\n"
    size_mb = len(text.encode("utf-8", "surrogateescape")) / MB

    rows: list[tuple[str, float, float]] = []  # (what, MB, seconds)
    redactor = Redactor()
    seconds, out = best_of(args.runs, lambda: redactor.redact(text))
    rows.append(("redact(whole log), one call", size_mb, seconds))
    parts = chunks(text, MB)
    seconds, _ = best_of(args.runs, lambda: [redactor.redact(part) for part in parts])
    rows.append((f"redact per 1 MB chunk ({len(parts)} calls)", size_mb, seconds))
    slice_lines = chunks(text, args.line_slice_mb * MB)[0].split("\n")
    slice_mb = sum(len(line.encode("utf-8", "surrogateescape")) + 1 for line in slice_lines) / MB
    seconds, _ = best_of(1, lambda: [redactor.redact(line) for line in slice_lines])
    rows.append((f"redact per line ({len(slice_lines):,} lines)", slice_mb, seconds))
    pseudonymizer = Redactor(mask_ips=True, mask_users=True, users=["alice", "zhangsan"])
    seconds, _ = best_of(args.runs, lambda: pseudonymizer.redact(text))
    rows.append(("redact(whole log), mask_ips + mask_users", size_mb, seconds))

    lines_total = len(lines)
    print(f"\nredaction: {size_mb:.1f} MB, {lines_total:,} lines, {len(planted)} planted secrets\n")
    print(f"{'what':48s} {'MB':>8s} {'seconds':>9s} {'MB/s':>8s}")
    for what, mb, secs in rows:
        print(f"{what:48s} {mb:8.1f} {secs:9.2f} {mb / secs:8.1f}")

    if planted:
        out_lines = out.split("\n")
        leaked = [n for n, secret in planted.items() if secret in out_lines[n]]
        changed = [n for n, (a, b) in enumerate(zip(lines, out_lines, strict=False)) if a != b and n not in planted]
        print(f"\nplanted secrets still in the output: {len(leaked)} of {len(planted)}")
        print(f"lines without a secret that changed: {len(changed)} of {lines_total - len(planted):,}")
        for n in (leaked + changed)[:5]:
            print(f"  line {n}: {lines[n][:160]!r}\n     -> {out_lines[n][:160]!r}")
        counter = Redactor()
        counter.redact(text)
        print(f"values redacted in one call: {counter.count} ({len(planted)} planted)")

    print(f"\n{'hostile input (1 MB)':48s} {'seconds':>9s}")
    for what, hostile_text in hostile().items():
        seconds, _ = best_of(1, lambda t=hostile_text: redactor.redact(t))
        print(f"{what:48s} {seconds:9.3f}")


if __name__ == "__main__":
    main()
