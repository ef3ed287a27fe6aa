"""The CUDA/NCCL path, checked on a GPU node: python benchmarks/gpu_check.py [--out DIR]

One NCCL rank per visible GPU (with no GPU the same checks run with gloo on CPU,
which is how this script itself is tested). Each check prints what it saw and
PASS or FAIL; the exit code is 1 when a check failed.

1. environment: torch, CUDA, NCCL, the GPUs;
2. preflight with the default --nproc-per-node (the visible GPUs) on a DDP script
   that trains and evaluates on the GPU: aligned, and the trace holds CUDA tensors
   (DDP's buckets and the eval all_reduce) from the recorder;
3. preflight --cpu on 2 ranks of the same script with rank 0 alone evaluating:
   rank-conditional-collective at the evaluate() all_reduce, on a GPU machine;
4. what preflight says when a script asks for more ranks than there are GPUs;
5. the Flight Recorder's dump of this backend, read by doctor's reader;
6. ncclcheck probe: backend, device, and its bandwidth figures;
7. the recorder's cost per small all_reduce on this backend (bench_preflight.py);
8. on a GPU node, the same on gloo with 2 ranks, where cores are many;
9. on a GPU node, doctor --native on one rank that waits at .item() for seconds of
   queued GPU work after an all_reduce: the sync point, the native CUDA frames, and
   the rank's GPU through NVML (when nvidia-ml-py is installed).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

TRAIN_SCRIPT = """
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

ONLY_RANK_ZERO_EVALUATES = os.environ.get("GPU_CHECK_BUG") == "1"


def evaluate(model, loader, device):
    model.eval()
    totals = torch.zeros(2, device=device)
    with torch.no_grad():
        for features, labels in loader:
            features, labels = features.to(device), labels.to(device)
            loss = F.cross_entropy(model(features), labels, reduction="sum")
            totals += torch.stack([loss, torch.tensor(float(len(labels)), device=device)])
    dist.all_reduce(totals)
    model.train()
    return (totals[0] / totals[1]).item()


def main():
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(512, 64, generator=gen)
    data = TensorDataset(features, (features[:, :8].sum(1) > 0).long())
    train_loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data))
    val_loader = DataLoader(data, batch_size=64, sampler=DistributedSampler(data, shuffle=False))
    model = DDP(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 2)).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        for features, labels in train_loader:
            optimizer.zero_grad()
            F.cross_entropy(model(features.to(device)), labels.to(device)).backward()
            optimizer.step()
        if not ONLY_RANK_ZERO_EVALUATES or dist.get_rank() == 0:
            print(f"epoch {epoch}: val loss {evaluate(model, val_loader, device):.4f}", flush=True)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""

EVAL_ALL_REDUCE_LINE = next(
    number for number, line in enumerate(TRAIN_SCRIPT.splitlines(), 1) if "dist.all_reduce(totals)" in line
)

FLIGHT_RECORDER_SCRIPT = """
import json, os, sys
import torch, torch.distributed as dist
import torch._C._distributed_c10d as c10d
from ncclcheck.evidence import flight_recorder

cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if cuda else "gloo")
if cuda:
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
value = torch.ones(4, device="cuda" if cuda else "cpu")
for _ in range(3):
    dist.all_reduce(value)
dist.broadcast(value, 0)
if cuda:
    torch.cuda.synchronize()
dump = getattr(c10d, "_dump_nccl_trace_json", None) if cuda else None
dump = dump or c10d._dump_fr_trace_json
path = flight_recorder.dump_path(dict(os.environ), dist.get_rank())
dumped = dump(includeCollectives=True)
with open(path, "wb") as handle:
    handle.write(dumped if isinstance(dumped, bytes) else dumped.encode())
print("RESULT " + json.dumps({"dumper": dump.__name__, **flight_recorder.read_dump(path)}), flush=True)
dist.barrier()
dist.destroy_process_group()
"""


# One rank that queues seconds of GPU work after an all_reduce and then reads a value:
# it waits at .item() for the device, as a rank whose collective lacks a partner does.
DEVICE_WAIT_SCRIPT = """
import os, time, torch, torch.distributed as dist
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
x = torch.randn(16384, 16384, device="cuda")
dist.all_reduce(x)
for _ in range(150):
    x = x @ x
print("queued", flush=True)
value = x.sum().item()
"""


def doctor_at_a_device_wait(checks: Checks, work: Path) -> None:
    """doctor on a real CUDA rank blocked at .item(): the sync point, native frames, NVML."""
    script = work / "device_wait.py"
    script.write_text(DEVICE_WAIT_SCRIPT)
    log = work / "device_wait.log"
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", str(script)]
    with log.open("w") as out:
        job = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while "queued" not in log.read_text() and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.5)
        code, out_text, err, wall = run(
            [sys.executable, "-m", "ncclcheck", "doctor", "--pid", str(job.pid), "--native", "--json"], 120
        )
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=30)
    try:
        report: dict[str, Any] = json.loads(out_text)
    except ValueError:
        report = {}
    where = (report.get("ranks") or [{}])[0].get("where", "")
    checks.record(
        "doctor on a CUDA rank waiting at .item() (sync point, --native frames, NVML)",
        "device sync point (.item())" in where,
        {
            "exit": code,
            "wall_s": round(wall, 1),
            "where": where,
            "gpus": report.get("summary", {}).get("gpus"),
            "movement": report.get("summary", {}).get("movement"),
            "stderr": last_error(err),
        },
    )


class Checks:
    def __init__(self, out: Path | None) -> None:
        self.results: list[dict[str, Any]] = []
        self.out = out

    def record(self, name: str, passed: bool | None, seen: dict[str, Any]) -> None:
        """passed None: an observation, neither pass nor fail."""
        label = {True: "PASS", False: "FAIL", None: "SEEN"}[passed]
        self.results.append({"check": name, "result": label, **seen})
        print(f"[{label}] {name}", flush=True)
        for key, value in seen.items():
            text = value if isinstance(value, str) else json.dumps(value)
            print(f"    {key}: {text}", flush=True)
        if self.out is not None:  # after every check: a run cut short still leaves what it saw
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "gpu_check.json").write_text(json.dumps(self.results, indent=2))


def last_error(err: str) -> str:
    """The line of a child's stderr that says what went wrong, else its last line."""
    lines = [line for line in err.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line or "error:" in line:
            return line.strip()[-400:]
    return lines[-1].strip()[-400:] if lines else ""


def run(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int, str, str, float]:
    start = time.perf_counter()
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO,
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                **(env or {}),
            },
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return 124, out, f"timed out after {timeout:.0f} s", time.perf_counter() - start
    return done.returncode, done.stdout, done.stderr, time.perf_counter() - start


def preflight(
    args: list[str], env: dict[str, str] | None = None, timeout: float = 240
) -> tuple[int, dict[str, Any], str, float]:
    """``ncclcheck preflight --json ARGS``: (exit code, report, last stderr line, wall seconds)."""
    code, out, err, wall = run(
        [sys.executable, "-m", "ncclcheck", "preflight", "--json", *args], timeout, env
    )
    try:
        report: dict[str, Any] = json.loads(out)
    except ValueError:
        report = {}
    return code, report, last_error(err), wall


def trace_calls(trace_dir: Path) -> list[dict[str, Any]]:
    """Every rank's recorded calls, read as doctor and preflight read them (a call line
    holds its number and refers to its site and shapes, written once: evidence/traces.py)."""
    sys.path.insert(0, str(REPO))
    from ncclcheck.evidence.traces import load_traces

    return [
        {"src": call.source, "op": call.op, "device": call.device, "shapes": call.shapes}
        for trace in load_traces(trace_dir).values()
        for call in trace.calls
    ]


def environment(checks: Checks) -> bool:
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    seen: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
        "nccl_available": dist.is_nccl_available(),
    }
    if cuda:
        seen["nccl"] = ".".join(str(part) for part in torch.cuda.nccl.version())
    checks.record("environment", None, seen)
    return cuda


def aligned_gpu_run(checks: Checks, work: Path, cuda: bool) -> None:
    script = work / "gpu_train.py"
    trace_dir = work / "traces-aligned"
    code, report, err, wall = preflight(["--trace-dir", str(trace_dir), str(script)])
    calls = trace_calls(trace_dir)
    devices = sorted({call["device"] for call in calls if call.get("device")})  # barrier: none
    by_source: dict[str, int] = {}
    for call in calls:
        key = f"{call.get('src')}:{call.get('op')}:{call.get('device')}"
        by_source[key] = by_source.get(key, 0) + 1
    expected = "cuda" if cuda else "cpu"
    eval_reduce = [c for c in calls if c.get("op") == "all_reduce" and c.get("src") == "python"]
    passed = (
        code == 0
        and report.get("verdict") == "aligned"
        and devices == [expected]
        and report.get("summary", {}).get("backend") == ("nccl" if cuda else "gloo")
        and any(c.get("src") == "ddp" for c in calls)
        and bool(eval_reduce)
    )
    checks.record(
        "preflight, default ranks, DDP on the GPU",
        passed,
        {
            "exit": code,
            "wall_s": round(wall, 1),
            "verdict": report.get("verdict"),
            "world_size": report.get("world_size"),
            "backend": report.get("summary", {}).get("backend"),
            "ranks": [
                {k: r.get(k) for k in ("rank", "collectives", "eval_batches")}
                for r in report.get("ranks", [])
            ],
            "call devices": devices,
            "calls by source:op:device": by_source,
            "eval all_reduce shapes": eval_reduce[0].get("shapes") if eval_reduce else None,
            "stderr": err,
        },
    )


def cpu_mapped_bug(checks: Checks, work: Path) -> None:
    script = work / "gpu_train.py"
    code, report, err, wall = preflight(
        ["--cpu", "--nproc-per-node", "2", str(script)], env={"GPU_CHECK_BUG": "1"}
    )
    finding = (report.get("findings") or [{}])[0]
    passed = (
        code == 1
        and finding.get("cause") == "rank-conditional-collective"
        and str(finding.get("site", "")).endswith(f"gpu_train.py:{EVAL_ALL_REDUCE_LINE}")
        and finding.get("ranks") == [0]
        and finding.get("absent_ranks") == [1]
    )
    checks.record(
        "preflight --cpu, 2 ranks, only rank 0 evaluates",
        passed,
        {
            "exit": code,
            "wall_s": round(wall, 1),
            "verdict": report.get("verdict"),
            "finding": {k: finding.get(k) for k in ("cause", "ranks", "absent_ranks", "op", "site")},
            "stderr": err,
        },
    )


def more_ranks_than_gpus(checks: Checks, work: Path, gpus: int) -> None:
    """An observation: what a user sees who asks for one rank more than there are GPUs."""
    code, report, err, wall = preflight(["--nproc-per-node", str(gpus + 1), str(work / "gpu_train.py")])
    finding = (report.get("findings") or [{}])[0]
    checks.record(
        f"preflight, {gpus + 1} ranks on {gpus} GPU(s)",
        None,
        {
            "exit": code,
            "wall_s": round(wall, 1),
            "verdict": report.get("verdict"),
            "finding": {k: finding.get(k) for k in ("cause", "absent_ranks", "site", "message", "evidence")},
            "stderr": err,
        },
    )


def flight_recorder_dump(checks: Checks, work: Path, cuda: bool) -> None:
    script = work / "fr_dump.py"
    script.write_text(FLIGHT_RECORDER_SCRIPT)
    env = {"TORCH_FR_BUFFER_SIZE": "1000", "TORCH_FR_DUMP_TEMP_FILE": str(work / "fr_rank_")}
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", str(script)]
    code, out, err, wall = run(argv, 180, env)
    line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
    result: dict[str, Any] = json.loads(line[len("RESULT ") :]) if line else {}
    ops = {call["op"] for call in result.get("last", {}).values()}
    expected = "nccl:broadcast" if cuda else "gloo:broadcast"
    checks.record(
        "Flight Recorder dump, read by doctor's reader",
        code == 0 and result.get("format") == "json" and expected in ops,
        {"exit": code, "wall_s": round(wall, 1), **result, "stderr": last_error(err)},
    )


def probe(checks: Checks, cuda: bool) -> None:
    argv = [sys.executable, "-m", "ncclcheck", "probe", "--json"]
    if cuda:
        argv += ["--max-bytes", str(64 << 20)]
    code, out, err, wall = run(argv, 300)
    try:
        report: dict[str, Any] = json.loads(out)
    except ValueError:
        report = {}
    summary = report.get("summary", {})
    largest: dict[str, dict[str, Any]] = {}
    for row in summary.get("performance", []):
        if row["bytes"] >= largest.get(row["op"], {}).get("bytes", -1):
            largest[row["op"]] = row
    checks_ok = [c["op"] for c in summary.get("checks", []) if not c.get("failed_on")]
    checks.record(
        "ncclcheck probe, default ranks",
        code == 0 and summary.get("backend") == ("nccl" if cuda else "gloo"),
        {
            "exit": code,
            "wall_s": round(wall, 1),
            "verdict": report.get("verdict"),
            "world_size": report.get("world_size"),
            "summary": {k: v for k, v in summary.items() if k not in ("performance", "checks")},
            "checks passed": checks_ok,
            "largest size per op": list(largest.values()),
            "stderr": last_error(err),
        },
    )


def recorder_cost(checks: Checks, backend: str, ranks: int) -> None:
    argv = [sys.executable, str(HERE / "bench_preflight.py"), "--repeats", "2", "--no-verdict"]
    argv += ["--backend", backend, "--nproc", str(ranks)]
    code, out, err, wall = run(argv, 300)
    checks.record(
        f"recorder cost per small {backend} all_reduce, {ranks} rank(s) (bench_preflight.py)",
        None if code == 0 else False,
        {"exit": code, "wall_s": round(wall, 1), "output": "\n" + out, "stderr": last_error(err)},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    parser.add_argument("--skip", action="append", default=[], help="skip a check by number (repeatable)")
    args = parser.parse_args()
    checks = Checks(args.out)
    cuda = environment(checks)
    import torch

    gpus = torch.cuda.device_count() if cuda else 0
    with tempfile.TemporaryDirectory(prefix="ncclcheck-gpu-check-") as folder:
        work = Path(folder)
        (work / "gpu_train.py").write_text(TRAIN_SCRIPT)
        steps = {
            "2": lambda: aligned_gpu_run(checks, work, cuda),
            "3": lambda: cpu_mapped_bug(checks, work),
            "4": lambda: more_ranks_than_gpus(checks, work, gpus) if cuda else None,
            "5": lambda: flight_recorder_dump(checks, work, cuda),
            "6": lambda: probe(checks, cuda),
            "7": lambda: recorder_cost(checks, "nccl", gpus) if cuda else recorder_cost(checks, "gloo", 2),
            # gloo where cores are many (the CI machine has 2)
            "8": lambda: recorder_cost(checks, "gloo", 2) if cuda else None,
            "9": lambda: doctor_at_a_device_wait(checks, work) if cuda else None,
        }
        for number, step in steps.items():
            if number not in args.skip:
                step()
    failed = [r["check"] for r in checks.results if r["result"] == "FAIL"]
    print(
        f"\n{len(checks.results) - len(failed)} of {len(checks.results)} checks without failure", flush=True
    )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
