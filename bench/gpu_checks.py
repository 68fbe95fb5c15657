"""Argus on a real GPU host: the checks that need one, each printing PASS or FAIL with its figures.

Run where NVIDIA's driver and PyTorch with CUDA are (py-spy on the PATH or --py-spy):

    PYTHONPATH=$PWD:$PWD/stage python bench/gpu_checks.py --out DIR

1. NVML. collectors.nvml.NvmlCollector reads every GPU idle and under load (a child process holding --load-gib GiB
   and multiplying matrices): the DCGM series it gives, utilisation and framebuffer moving as they should, whether
   the driver lets it watch Xid events, what one collect costs; and the node agent's GPU path (NodeAgent's batch
   body -> AgentInbox -> AgentGpuCollector) gives the same series about the same GPUs.
2. A real CUDA OOM. A training loop doubling its batch until PyTorch raises OutOfMemoryError; its log goes through
   `argus analyze --json` and `--report` and must come out gpu_oom; NVML's framebuffer reading at the peak.
3. A real hung GPU job. Two ranks (torch.distributed over gloo, CUDA tensors, one GPU): rank 0's host thread blocks
   in torch.cuda.synchronize() behind a kernel that does not end, rank 1 waits in all_reduce. py-spy dumps both
   twice, 2 s apart; detectors.hang_stacks must judge it hung and name rank 0; NVML shows the GPU busy throughout
   (what a stuck NCCL kernel looks like from outside).

What it writes under --out: checks.txt (this run's lines), train_oom.log, analyze.json, report.md, the ranks' dumps.
One file for the parent and its children (`--child ...`): the checks and the GPU programs they watch are read
together.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HANG_CYCLES = 400_000_000_000  # a kernel that spins ~200 s at 2 GHz: longer than the check, killed after it
lines_out: list[str] = []


def say(text: str) -> None:
    print(text, flush=True)
    lines_out.append(text)


def verdict(name: str, ok: bool, detail: str) -> bool:
    say(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")
    return ok


# -- the children: GPU programs the checks watch ------------------------------------------------------------------

def child_load(gib: float, seconds: float) -> None:
    import torch

    hold = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    print("ready", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
    del hold


def child_train_oom() -> None:
    import torch

    torch.manual_seed(0)
    width = 8192
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)]).cuda().to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters())
    batch = 4096
    for step in range(1, 64):
        x = torch.randn(batch, width, device="cuda", dtype=torch.bfloat16)
        loss = model(x).float().pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**30
        print(f"step:{step} - loss:{loss.item():.4f} - batch_size:{batch} - max_memory_allocated_gib:{peak:.1f}",
              flush=True)
        batch *= 2


def child_rank(rank: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.cuda.set_device(0)
    grads = torch.ones(1 << 20, device="cuda")
    for step in range(1, 4):
        dist.all_reduce(grads)
        torch.cuda.synchronize()
        print(f"rank {rank} step:{step} - grad_sum:{grads[0].item():.0f}", flush=True)
        time.sleep(0.2)
    if rank == 0:
        optimizer_step_on_a_stuck_gpu(torch)
    dist.all_reduce(grads)  # rank 1 waits here for rank 0
    print(f"rank {rank} passed the all_reduce", flush=True)


def optimizer_step_on_a_stuck_gpu(torch: Any) -> None:
    torch.cuda._sleep(HANG_CYCLES)  # a kernel that does not end in time: a stuck GPU, as the ranks see it
    print("rank 0 waits for its GPU", flush=True)
    torch.cuda.synchronize()


# -- the checks -----------------------------------------------------------------------------------------------------

def gpu_values(collector: Any, index: int = 0) -> dict[str, float]:
    return {s.metric: s.value for s in collector.samples() if s.gpu == index}


def check_nvml(out: Path, load_gib: float) -> bool:
    import httpx

    from argus.agents.inbox import AgentInbox
    from argus.agents.node_agent import NodeAgent
    from collectors.agent_gpus import AgentGpuCollector, GpuReading
    from collectors.nvml import NvmlCollector

    ok = True
    collector = NvmlCollector(hostname=socket.gethostname())
    first = collector.samples()
    gpus = sorted({s.gpu for s in first})
    say(f"NVML: {len(gpus)} GPU(s): " + "; ".join(sorted({f'{s.model_name} {s.uuid}' for s in first})))
    costs = []
    for _ in range(20):
        began = time.perf_counter()
        collector.samples()
        costs.append((time.perf_counter() - began) * 1000)
    say(f"one collect of {len(first)} series: median {statistics.median(costs):.2f} ms, max {max(costs):.2f} ms")
    idle = gpu_values(collector)
    child = subprocess.Popen([sys.executable, __file__, "--child", "load", "--gib", str(load_gib), "--seconds", "12"],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    ready = child.stdout.readline().strip() == "ready"
    time.sleep(2.0)
    busy_samples = []
    for _ in range(4):
        busy_samples.append(gpu_values(collector))
        time.sleep(1.0)
    child.wait(timeout=60)
    busy = max(busy_samples, key=lambda v: v.get("DCGM_FI_DEV_GPU_UTIL", 0))
    say("GPU 0 idle -> under load:")
    for metric in sorted(set(idle) | set(busy)):
        say(f"  {metric:42s} {idle.get(metric, float('nan')):>14.1f} -> {busy.get(metric, float('nan')):>14.1f}")
    grew = busy.get("DCGM_FI_DEV_FB_USED", 0) - idle.get("DCGM_FI_DEV_FB_USED", 0)
    ok &= verdict("nvml utilisation", ready and busy.get("DCGM_FI_DEV_GPU_UTIL", 0) >= 50,
                  f"{idle.get('DCGM_FI_DEV_GPU_UTIL')}% idle, {busy.get('DCGM_FI_DEV_GPU_UTIL')}% under load")
    ok &= verdict("nvml framebuffer", grew >= 0.9 * load_gib * 1024,
                  f"FB_USED grew {grew:.0f} MiB with {load_gib * 1024:.0f} MiB held")
    say(f"Xid events watched on {len(collector.xid_watched)} of {len(gpus)} GPU(s); "
        f"errors: {collector.last_errors or 'none'}")
    collector.shutdown()

    inbox = AgentInbox()

    def central(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        gpus_in = [GpuReading(g["gpu"], g["uuid"], g["model_name"], g["values"], g["labels"]) for g in body["gpus"]]
        inbox.put(body["node_id"], body["node_ip"], [], body["agent"], gpus=gpus_in, hostname=body["hostname"])
        return httpx.Response(200, json={"accepted": 0, "gpus": len(gpus_in)})

    with tempfile.TemporaryDirectory() as logs:
        agent = NodeAgent(node_id="this-node", node_ip="127.0.0.1", central_url="http://central.invalid",
                          token="t", logs_dir=logs, kernel_log="off", transport=httpx.MockTransport(central))
        agent.run_once()
        signals = AgentGpuCollector(inbox).collect()
        agent.stop()
    direct = {(s.metric, s.uuid) for s in first}
    via_agent = {(s.attrs["metric"], s.subject.id) for s in signals}
    ok &= verdict("agent GPU path", via_agent == direct and bool(direct),
                  f"{len(via_agent)} series through the agent, {len(direct)} read directly; agent stats gpus="
                  f"{agent.stats()['gpus']!r}")
    return ok


def watch_fb(stop_when: subprocess.Popen[Any], collector: Any) -> tuple[float, float]:
    """The most framebuffer used and the highest utilisation seen while `stop_when` runs."""
    fb, util = 0.0, 0.0
    while stop_when.poll() is None:
        values = gpu_values(collector)
        fb = max(fb, values.get("DCGM_FI_DEV_FB_USED", 0.0))
        util = max(util, values.get("DCGM_FI_DEV_GPU_UTIL", 0.0))
        time.sleep(0.2)
    return fb, util


def argus(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "argus.cli", *args], capture_output=True, text=True, timeout=300)


def check_oom(out: Path) -> bool:
    from collectors.nvml import NvmlCollector

    log = out / "train_oom.log"
    collector = NvmlCollector(hostname=socket.gethostname())
    total = gpu_values(collector)
    with log.open("w") as f:
        began = time.monotonic()
        child = subprocess.Popen([sys.executable, __file__, "--child", "train-oom"], stdout=f, stderr=subprocess.STDOUT)
        peak_fb, _ = watch_fb(child, collector)
        took = time.monotonic() - began
    collector.shutdown()
    text = log.read_text(errors="replace")
    raised = "OutOfMemoryError" in text
    say(f"training loop ended with exit code {child.returncode} after {took:.1f} s; "
        f"{sum(1 for line in text.splitlines() if line.startswith('step:'))} steps; last lines:")
    for line in text.strip().splitlines()[-3:]:
        say(f"  | {line[:300]}")
    fb_total = total.get("DCGM_FI_DEV_FB_FREE", 0) + total.get("DCGM_FI_DEV_FB_USED", 0)
    say(f"NVML framebuffer used at the peak: {peak_fb:.0f} of about {fb_total:.0f} MiB")
    ok = verdict("real CUDA OOM raised", raised and child.returncode != 0, "torch.OutOfMemoryError in the log")
    began = time.perf_counter()
    result = argus("analyze", "--json", str(log))
    seconds = time.perf_counter() - began
    (out / "analyze.json").write_text(result.stdout + result.stderr)
    try:
        answer = json.loads(result.stdout.splitlines()[0])
    except (ValueError, IndexError):
        answer = {}
    ok &= verdict("argus analyze on the real OOM", answer.get("category") == "gpu_oom",
                  f"category={answer.get('category')} confidence={answer.get('confidence')} in {seconds:.1f} s; "
                  f"summary: {str(answer.get('summary'))[:200]}")
    report = argus("analyze", "--report", str(log))
    (out / "report.md").write_text(report.stdout + report.stderr)
    say(f"argus analyze --report: exit {report.returncode}, {len(report.stdout)} characters (report.md)")
    return ok


def dump(py_spy: str, pid: int, native: bool = False) -> str:
    cmd = [py_spy, "dump", "--pid", str(pid)] + (["--native"] if native else [])
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "Error: py-spy dump timed out"
    return done.stdout if done.returncode == 0 else f"Error: {done.stderr.strip() or done.stdout.strip()}"


def check_hang(out: Path, py_spy: str) -> bool:
    from collectors.nvml import NvmlCollector
    from detectors.hang_stacks import RankStack, judge

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    logs = [(out / f"rank{r}.log").open("w") for r in (0, 1)]
    ranks = [subprocess.Popen([sys.executable, __file__, "--child", "rank", "--rank", str(r), "--port", str(port)],
                              stdout=logs[r], stderr=subprocess.STDOUT, start_new_session=True) for r in (0, 1)]
    collector = NvmlCollector(hostname=socket.gethostname())
    ok = True
    try:
        deadline = time.monotonic() + 120
        while "waits for its GPU" not in (out / "rank0.log").read_text() and time.monotonic() < deadline:
            if any(r.poll() is not None for r in ranks):
                break
            time.sleep(0.5)
        time.sleep(3.0)  # rank 1 is in all_reduce by now
        utils = []
        samples = []
        for _ in range(2):
            samples.append([RankStack(f"rank {i} pid {p.pid}", p.pid, "127.0.0.1", dump(py_spy, p.pid), gpu="0")
                            for i, p in enumerate(ranks)])
            utils.append(gpu_values(collector).get("DCGM_FI_DEV_GPU_UTIL"))
            time.sleep(2.0)
        native = dump(py_spy, ranks[0].pid, native=True)
        for i in (0, 1):
            (out / f"rank{i}_stack.txt").write_text(samples[1][i].dump + ("\n--- native ---\n" + native if i == 0
                                                                           else ""))
        call = judge(samples[0], samples[1])
        for i in (0, 1):
            say(f"rank {i} py-spy dump, innermost frames:")
            for line in [x for x in samples[1][i].dump.splitlines() if x.startswith("    ")][:4]:
                say(f"  | {line.strip()}")
        native_frames = [x.strip() for x in native.splitlines() if x.startswith("    ")][:6]
        say("rank 0 with --native: " + (" <- ".join(native_frames) if native_frames else native[:300]))
        say(f"NVML utilisation while hung: {utils}")
        culprit = call.localization.culprits[0].rank.pid if call.localization.culprits else None
        ok &= verdict("hang judged from real stacks", call.verdict == "hung" and culprit == ranks[0].pid,
                      f"verdict={call.verdict}; {call.localization.sentence}")
        ok &= verdict("GPU busy while no rank moves", all((u or 0) >= 90 for u in utils), f"utilisation {utils}")
    finally:
        for r in ranks:
            if r.poll() is None:
                os.killpg(r.pid, signal.SIGKILL)
            r.wait(timeout=60)
        for f in logs:
            f.close()
        collector.shutdown()
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("gpu-checks"))
    parser.add_argument("--load-gib", type=float, default=16.0)
    parser.add_argument("--py-spy", default=shutil.which("py-spy") or "py-spy")
    parser.add_argument("--only", choices=("nvml", "oom", "hang"), action="append")
    parser.add_argument("--child", choices=("load", "train-oom", "rank"))
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--port", type=int, default=29500)
    args = parser.parse_args()
    if args.child == "load":
        child_load(args.gib, args.seconds)
        return 0
    if args.child == "train-oom":
        child_train_oom()
        return 0
    if args.child == "rank":
        child_rank(args.rank, args.port)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    checks = {"nvml": lambda: check_nvml(args.out, args.load_gib), "oom": lambda: check_oom(args.out),
              "hang": lambda: check_hang(args.out, args.py_spy)}
    results = {}
    for name in args.only or list(checks):
        say(f"== {name} ==")
        began = time.monotonic()
        try:
            results[name] = checks[name]()
        except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others' figures
            results[name] = verdict(name, False, f"{type(exc).__name__}: {exc}")
        say(f"({name}: {time.monotonic() - began:.1f} s)")
    say("checks: " + ", ".join(f"{k} {'PASS' if v else 'FAIL'}" for k, v in results.items()))
    (args.out / "checks.txt").write_text("\n".join(lines_out) + "\n")
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
