"""doctor on healthy jobs: how often it calls a job that trains hung (python benchmarks/bench_healthy.py).

Each shape is a 2-rank gloo job under torchrun that never hangs, in the phase where a
hang is most easily imagined:

- backward: DDP with wide layers, most of its time in backward's all-reduce
- loader: the ranks wait on a DataLoader whose worker decodes slowly
- evaluation: every rank decodes its shard sample by sample for ~10 s, no collective
- checkpoint: rank 0 alone saves for ~5 s while the other rank waits in a barrier
- loaded: a plain training loop on a machine that a second CPU-bound job keeps busy
- checkpoint, loaded: the checkpoint shape with four busy loops beside it (the CI
  machine running the suite: the saving rank gets a fraction of a core)

Once the job has reached that phase, ``ncclcheck doctor --json --pid <agent>`` runs
RUNS times (10 by default) one after the other; the table counts the verdicts. A
healthy job must never be ``hang``. The jobs and the load are reaped at the end.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ncclcheck.launch.proctree import kill_tree  # noqa: E402

SCRIPTS = REPO / "tests" / "scripts"
TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2")


@dataclass(frozen=True)
class Shape:
    name: str
    script: str
    ready: str  # what rank 0 prints once the job is in the phase to look at
    env: tuple[tuple[str, str], ...] = ()
    load: int = 0  # CPU-bound processes of another job started beside it


SHAPES = (
    Shape("backward", "ddp_long_backward.py", "step 1:", (("WIDTH", "2560"),)),
    Shape("loader", "loader_bound.py", "step 1:"),
    Shape("evaluation", "long_evaluation.py", "eval started"),
    Shape("checkpoint", "long_checkpoint_save.py", "saving"),
    Shape("loaded", "training_still_running.py", "step 50:", load=2),
    Shape("checkpoint, loaded", "long_checkpoint_save.py", "saving", load=4),
)


def busy_loop() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)


def doctor(pid: int) -> tuple[str, int, float]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "ncclcheck", "doctor", "--json", "--pid", str(pid)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
    )
    verdict = json.loads(done.stdout)["verdict"] if done.stdout.strip() else f"no report ({done.returncode})"
    return verdict, done.returncode, time.perf_counter() - start


def measure(shape: Shape, runs: int) -> tuple[collections.Counter[str], list[float]]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RUN_S": str(60 + 8 * runs), **dict(shape.env)}
    log = Path(f"/tmp/ncclcheck-bench-healthy-{os.getpid()}-{shape.name}.log")
    load = [busy_loop() for _ in range(shape.load)]
    with log.open("w") as out:
        job = subprocess.Popen(
            [*TORCHRUN, str(SCRIPTS / shape.script)],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    verdicts: collections.Counter[str] = collections.Counter()
    seconds: list[float] = []
    try:
        deadline = time.monotonic() + 120
        while shape.ready not in log.read_text() and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.5)
        if shape.ready not in log.read_text():
            raise SystemExit(
                f"{shape.name}: the job never printed {shape.ready!r}:\n{log.read_text()[-2000:]}"
            )
        for _ in range(runs):
            if job.poll() is not None:
                raise SystemExit(f"{shape.name}: the job ended before the runs were done")
            verdict, _code, took = doctor(job.pid)
            verdicts[verdict] += 1
            seconds.append(took)
    finally:
        kill_tree(job.pid)
        job.wait(timeout=30)
        for proc in load:
            kill_tree(proc.pid)
            proc.wait(timeout=30)
        log.unlink(missing_ok=True)
    return verdicts, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--shape", action="append", choices=[s.name for s in SHAPES])
    args = parser.parse_args()
    print(f"doctor on healthy 2-rank gloo jobs, {args.runs} runs each ({psutil.cpu_count()} cores)")
    print(f"{'shape':<20} {'verdicts':<40} {'hang':>5} {'median s':>9}")
    hung = 0
    for shape in SHAPES:
        if args.shape and shape.name not in args.shape:
            continue
        verdicts, seconds = measure(shape, args.runs)
        hung += verdicts["hang"]
        said = ", ".join(f"{v} {n}" for v, n in verdicts.most_common())
        median = sorted(seconds)[len(seconds) // 2]
        print(f"{shape.name:<20} {said:<40} {verdicts['hang']:>5} {median:>9.1f}", flush=True)
    print(f"hang verdicts on healthy jobs: {hung}")


if __name__ == "__main__":
    main()
