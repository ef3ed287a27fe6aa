"""lint on the catalogue's scripts, on small sources written for each rule, and through the CLI."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jsonschema
import pytest

from ncclcheck.lint import run_lint

from ..conftest import FRAMEWORKS, PLAYBOOKS, REPO, SCRIPTS, run_bounded

SCHEMA = json.loads((REPO / "ncclcheck" / "schemas" / "report.schema.json").read_text())


def lint_source(tmp_path: Path, source: str, name: str = "train.py") -> list[tuple[str, int, str]]:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    findings, _ = run_lint([path])
    return [(f.cause, f.location.line, f.severity) for f in findings]


# -- the catalogue -------------------------------------------------------------------


def test_every_repro_that_shows_in_source_is_flagged_at_its_line(catalogue) -> None:
    for playbook in catalogue:
        findings, _ = run_lint([playbook.repro_path])
        expect = playbook.repro
        if not expect.lint_site:
            assert findings == [], (playbook.id, findings)
            continue
        line = expect.site_line(playbook.folder, expect.lint_site)
        hits = [f for f in findings if f.cause == playbook.id and f.location.line == line]
        assert hits, (playbook.id, line, [(f.cause, f.location.line) for f in findings])


def test_every_fixed_script_is_clean(catalogue) -> None:
    for playbook in catalogue:
        findings, _ = run_lint([playbook.fixed_path])
        assert findings == [], (playbook.id, findings)


def test_a_ddp_model_passed_to_a_rank_zero_helper_is_followed_into_its_forward(tmp_path: Path) -> None:
    # evaluate(model, loader) under `if rank == 0`: DDP's forward() broadcasts the
    # BatchNorm buffers, so the call inside the helper is the collective; a warning,
    # since a model without buffers broadcasts nothing.
    script = SCRIPTS / "ddp_buffers_rank0_eval.py"
    findings, _ = run_lint([script])
    (finding,) = [f for f in findings if f.cause == "rank-conditional-collective"]
    assert finding.severity == "warning"
    assert "BatchNorm buffers" in script.read_text().splitlines()[finding.location.line - 1]
    assert "forward through DistributedDataParallel" in finding.message
    assert "through evaluate() called at" in finding.message
    # The same script with buffer-free layers, or broadcast_buffers=False: nothing to say.
    text = script.read_text()
    for variant in (
        text.replace("nn.BatchNorm1d(4)", "nn.ReLU()"),
        text.replace("nn.Linear(4, 1)))", "nn.Linear(4, 1)), broadcast_buffers=False)"),
    ):
        assert variant != text
        copy = tmp_path / "variant.py"
        copy.write_text(variant)
        findings, _ = run_lint([copy])
        assert not [f for f in findings if f.cause == "rank-conditional-collective"], findings


def test_an_iterable_eval_set_is_judged_by_its_own_split_not_by_a_sampler(tmp_path: Path) -> None:
    script = SCRIPTS / "eval_iterable_uneven.py"
    findings, _ = run_lint([script])
    (finding,) = findings
    assert (finding.cause, finding.severity) == ("uneven-eval-batches", "warning")
    assert (
        "val_loader = DataLoader(RankStream(5)" in script.read_text().splitlines()[finding.location.line - 1]
    )
    assert "an IterableDataset whose __iter__ splits the stream by rank" in finding.message
    # a stream that does not split by rank: no sampler to ask for, nothing to say
    copy = tmp_path / "stream.py"
    copy.write_text(
        script.read_text().replace(
            "range(dist.get_rank(), self.samples, dist.get_world_size())", "range(self.samples)"
        )
    )
    findings, _ = run_lint([copy])
    assert findings == [], findings


def test_a_collective_in_a_helper_module_is_reported_at_the_helper_with_the_chain() -> None:
    findings, _ = run_lint([SCRIPTS / "helper_project" / "train.py"])
    (finding,) = findings
    assert finding.cause == "rank-conditional-collective"
    assert finding.location.path.endswith("helper_project/metrics.py")
    assert (
        "dist.all_reduce(stats)"
        in (SCRIPTS / "helper_project" / "metrics.py").read_text().splitlines()[finding.location.line - 1]
    )
    assert "is_main" in finding.message
    chain = " ".join(finding.evidence)
    assert "log_validation() called at" in chain and "mean_loss() called at" in chain


def test_accelerate_gather_under_is_main_process() -> None:
    findings, _ = run_lint([FRAMEWORKS / "accelerate_misaligned.py"])
    causes = {(f.cause, f.severity) for f in findings}
    assert ("rank-conditional-collective", "error") in causes
    (gather,) = [f for f in findings if f.cause == "rank-conditional-collective"]
    assert "accelerator.gather" in gather.message and "accelerator.is_main_process" in gather.message


def test_framework_examples_each_misaligned_script_once_and_no_aligned_one() -> None:
    """accelerate's gather, Lightning's self.log(sync_dist=True), a Trainer callback's
    all_reduce and a torchmetrics compute(), each under a rank test; the fixed scripts
    are clean."""
    findings, _ = run_lint([FRAMEWORKS])
    found = sorted((Path(f.location.path).name, f.cause, f.severity) for f in findings)
    assert found == [
        ("accelerate_misaligned.py", "rank-conditional-collective", "error"),
        ("lightning_misaligned.py", "rank-conditional-collective", "error"),
        ("torchmetrics_misaligned.py", "rank-conditional-collective", "error"),
        ("transformers_misaligned.py", "rank-conditional-collective", "error"),
    ]
    conditions = {Path(f.location.path).name: f.message for f in findings}
    assert "accuracy.compute() (torchmetrics syncs its states)" in conditions["torchmetrics_misaligned.py"]
    assert "`self.trainer.is_global_zero`" in conditions["lightning_misaligned.py"]
    assert "self.log(sync_dist=True)" in conditions["lightning_misaligned.py"]
    assert "`state.is_world_process_zero`" in conditions["transformers_misaligned.py"]


# -- rules, one small source each ------------------------------------------------------

HEADER = """
import os, sys, time
import torch
import torch.distributed as dist
"""


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (  # a per-rank wall clock ends a loop that all-reduces (pytorch#22834)
            """
            def train(x, budget_s):
                start = time.time()
                while time.time() - start < budget_s:
                    dist.all_reduce(x)
            """,
            ("unsynchronized-decision", "warning"),
        ),
        (  # decoding until this rank's own sequences end, each step all-gathering
            """
            def decode(step, tokens, out):
                while not (tokens[:, -1] == 0).all().item():
                    dist.all_gather_into_tensor(out, step(tokens))
            """,
            ("data-dependent-branch", "warning"),
        ),
        (  # derived rank flag
            """
            def log(x):
                is_main = dist.get_rank() == 0
                if is_main:
                    dist.all_reduce(x)
            """,
            ("rank-conditional-collective", "error"),
        ),
        (  # a collective in a return value still runs before the return
            """
            def log(x):
                if dist.get_rank() == 0:
                    return dist.all_reduce(x)
                return None
            """,
            ("rank-conditional-collective", "error"),
        ),
        (  # local_rank from the environment, the HF idiom
            """
            def step(args, x):
                if args.local_rank in (-1, 0):
                    dist.barrier()
            """,
            ("rank-conditional-collective", "error"),
        ),
        (  # a clean exit on non-zero ranks ahead of a barrier
            """
            def save(x):
                if dist.get_rank() != 0:
                    sys.exit(0)
                torch.save(x, "x.pt")
                dist.barrier()
            """,
            ("rank-early-exit", "error"),
        ),
        (  # a continue under a NaN test skips the all_reduce after it
            """
            def train(batches):
                for x in batches:
                    if torch.isnan(x).any():
                        continue
                    dist.all_reduce(x)
            """,
            ("data-dependent-branch", "warning"),
        ),
        (  # a decision on the clock
            """
            def train(batches, start):
                for x in batches:
                    dist.all_reduce(x)
                    if time.time() - start > 3600:
                        break
            """,
            ("unsynchronized-decision", "warning"),
        ),
        (  # dist.reduce leaves the sum on dst only: the other ranks decide on their own value
            """
            def should_stop(loss):
                dist.reduce(loss, dst=0)
                if loss.item() < 0.1:
                    return True
                dist.barrier()
                return False
            """,
            ("unsynchronized-decision", "warning"),
        ),
        (  # a helper of the project's that checks a file each rank sees at its own time
            """
            def should_resume(path):
                return os.path.exists(path)

            def resume(path):
                if should_resume(path):
                    state = torch.load(path)
                    dist.broadcast(state["step"], src=0)
            """,
            ("unsynchronized-decision", "warning"),
        ),
        (  # Lightning's strategy broadcast, on rank 0 alone
            """
            def share_best(trainer, best):
                if trainer.is_global_zero:
                    best = trainer.strategy.broadcast(best)
                return best
            """,
            ("rank-conditional-collective", "error"),
        ),
        (  # the rank a loop's previous pass left in the name, read at the top of the next
            """
            def rounds(states):
                leader = None
                for state in states:
                    if leader == 0:
                        dist.all_reduce(state)
                    leader = dist.get_rank()
            """,
            ("rank-conditional-collective", "error"),
        ),
        (  # generate() under FSDP without synced_gpus: one gather per new token, per rank
            """
            from torch.distributed.fsdp import fully_shard

            def sample(model, batch):
                fully_shard(model)
                return model.generate(batch, max_new_tokens=20)
            """,
            ("data-dependent-branch", "warning"),
        ),
        (  # files listed in file-system order
            """
            def sync(folder):
                for name in os.listdir(folder):
                    dist.broadcast(torch.load(name), src=0)
            """,
            ("collective-order-mismatch", "warning"),
        ),
        (  # Lightning's rank_zero_only
            """
            from lightning.pytorch.utilities import rank_zero_only

            @rank_zero_only
            def report(x):
                dist.all_reduce(x)
            """,
            ("rank-conditional-collective", "error"),
        ),
        (  # a group created by its members alone: every rank enters new_group
            """
            def evaluate(x, eval_ranks):
                if dist.get_rank() in eval_ranks:
                    group = dist.new_group(eval_ranks)
                    dist.all_reduce(x, group=group)
            """,
            ("rank-conditional-collective", "error"),
        ),
        (  # ZeroRedundancyOptimizer consolidated where rank 0 alone saves
            """
            def save(optimizer, path):
                if dist.get_rank() == 0:
                    optimizer.consolidate_state_dict(to=0)
                    torch.save(optimizer.state_dict(), path)
            """,
            ("rank-conditional-collective", "error"),
        ),
        (  # Lightning: trainer.save_checkpoint() on global zero only (a barrier inside)
            """
            import lightning

            class SaveBest(lightning.Callback):
                def on_validation_end(self, trainer, module):
                    if trainer.is_global_zero:
                        trainer.save_checkpoint("best.ckpt")
            """,
            ("rank-conditional-collective", "error"),
        ),
        (  # Lightning: self.log(sync_dist=True) on global zero only
            """
            import lightning

            class Module(lightning.LightningModule):
                def validation_step(self, batch, index):
                    loss = self.compute(batch)
                    if self.trainer.is_global_zero:
                        self.log("val_loss", loss, sync_dist=True)
            """,
            ("rank-conditional-collective", "error"),
        ),
    ],
)
def test_rules(tmp_path: Path, body: str, expected: tuple[str, str]) -> None:
    found = lint_source(tmp_path, HEADER + textwrap.dedent(body))
    assert expected in {(cause, severity) for cause, _line, severity in found}, found


@pytest.mark.parametrize(
    "body",
    [
        # rank 0 only prints and saves: no collective inside
        """
        def epoch_end(model, loss):
            dist.all_reduce(loss)
            if dist.get_rank() == 0:
                print(loss.item())
                torch.save(model.state_dict(), "model.pt")
        """,
        # both sides of the rank test make the same collective
        """
        def share(x, y):
            if dist.get_rank() == 0:
                dist.broadcast(x, src=0)
            else:
                dist.broadcast(y, src=0)
        """,
        # a condition that is the same on every rank
        """
        def maybe_sync(x):
            if dist.is_initialized() and dist.get_world_size() > 1:
                dist.all_reduce(x)
        """,
        # point-to-point under a rank test is how send/recv pair up
        """
        def pipe(x):
            if dist.get_rank() == 0:
                dist.send(x, dst=1)
            else:
                dist.recv(x, src=0)
        """,
        # the value tested was all-reduced first: every rank sees the same number
        """
        def stop(flag):
            for step in range(10):
                dist.all_reduce(flag)
                if flag.item() > 0:
                    break
                dist.barrier()
        """,
        # an error path: a raise fails the rank and torchrun stops the rest (a crash, not a wait)
        """
        def load(x, path):
            if dist.get_rank() == 0 and not os.path.exists(path):
                raise FileNotFoundError(path)
            dist.broadcast(x, src=0)
        """,
        # a sorted listing is the same everywhere
        """
        def sync(folder):
            for name in sorted(os.listdir(folder)):
                dist.broadcast(torch.load(name), src=0)
        """,
        # The false positives met on accelerate and torch.distributed, kept as tests:
        # "main process first" (accelerate's _goes_first): one barrier on each side
        """
        def main_process_first(is_main):
            is_main = dist.get_rank() == 0
            if not is_main:
                dist.barrier()
            yield
            if is_main:
                dist.barrier()
        """,
        # the same idiom with local ranks, -1 for "not distributed" (YOLOv5's
        # torch_distributed_zero_first, the transformers examples): complementary over
        # every rank though neither test is the other's negation
        """
        def torch_distributed_zero_first(local_rank):
            if local_rank not in [-1, 0]:
                dist.barrier(device_ids=[local_rank])
            yield
            if local_rank == 0:
                dist.barrier(device_ids=[0])
        """,
        """
        def prepare(args):
            if args.local_rank > 0:
                dist.barrier()
            download()
            if args.local_rank in (-1, 0):
                dist.barrier()
        """,
        # "is this job distributed" in the local_rank idiom: true on every rank of a job
        """
        def sync(args):
            if args.local_rank != -1:
                dist.barrier()
        """,
        """
        def setup(local_rank, model):
            if local_rank == -1:
                return model
            dist.barrier()
            return model
        """,
        # the object of `state.rank = ...` is not itself a rank value
        """
        def init(state, module):
            state.rank = dist.get_rank()
            if state.sync_module_states:
                dist.broadcast(module.weight, src=0)
        """,
        # an early return decided by an inner, ordinary test under an outer rank test
        # (torch.distributed.fsdp's _broadcast_state)
        """
        def broadcast_state(state):
            if dist.get_rank() == 0:
                if not isinstance(state, torch.Tensor):
                    return state
                tensor = state
            else:
                if not isinstance(state, dict):
                    return state
                tensor = torch.zeros(3)
            dist.broadcast(tensor, src=0)
            return tensor
        """,
        # an exit in one branch does not skip the collective of another branch
        """
        def load(kind, model):
            if kind == "full":
                if dist.get_rank() != 0:
                    return None
                state = torch.load("full.pt")
            elif kind == "sharded":
                state = torch.load(f"shard{dist.get_rank()}.pt")
                dist.barrier()
            return state
        """,
        # a dict filled on rank 0, then replaced by what rank 0 broadcast
        """
        def share(full):
            ret = {}
            if dist.get_rank() == 0:
                for key, value in full.items():
                    ret[key] = value
            box = [ret]
            dist.broadcast_object_list(box, src=0)
            ret = box[0]
            for key, value in ret.items():
                dist.broadcast(value, src=0)
        """,
        # len() of a Python list is the same on every rank as a rule
        """
        def flush(keys, tensors):
            if len(keys) >= 1:
                dist.broadcast(tensors, src=0)
        """,
        # unpacked side by side, only `rank` is rank-derived: the world size is not
        """
        def main():
            rank, world = dist.get_rank(), dist.get_world_size()
            if world > 1:
                dist.barrier()
        """,
        # a loop bounded by a step count, and one whose stop flag every rank agreed on
        """
        def train(x, max_steps):
            step = 0
            while step < max_steps:
                dist.all_reduce(x)
                step += 1
            done = False
            while not done:
                flag = torch.tensor([float(x.sum() > 0)])
                dist.all_reduce(flag)
                done = flag.item() == 0
        """,
        # a loop test that broadcasts rank 0's clock: every rank gets the same answer
        """
        def agreed(deadline):
            flag = torch.tensor([float(time.time() < deadline)])
            dist.broadcast(flag, src=0)
            return flag.item() > 0

        def train(x, budget_s):
            start = time.time()
            while agreed(start + budget_s):
                dist.all_reduce(x)
        """,
        # generate() with synced_gpus=True keeps every rank stepping until all are done
        """
        from torch.distributed.fsdp import fully_shard

        def sample(model, batch):
            fully_shard(model)
            return model.generate(batch, max_new_tokens=20, synced_gpus=True)
        """,
        # a loader factory: the caller prepares (shards) what it returns
        """
        from torch.utils.data import DataLoader

        def loaders(accelerator, train_set, val_set):
            train_loader = DataLoader(train_set, batch_size=8)
            eval_loader = DataLoader(val_set, batch_size=8)
            return train_loader, eval_loader
        """,
        # a subgroup's collective under a test of membership in that subgroup
        """
        def sync_stage(x, stage_ranks):
            stage = dist.new_group(stage_ranks)
            if dist.get_rank() in stage_ranks:
                dist.all_reduce(x, group=stage)
            if dist.get_rank() in dist.get_process_group_ranks(stage):
                dist.broadcast(x, stage_ranks[0], stage)
            if dist.get_rank(stage) >= 0:
                dist.barrier(group=stage)
        """,
        # with use_local_synchronization=True only the members create the group
        """
        def evaluate(x, eval_ranks):
            if dist.get_rank() in eval_ranks:
                group = dist.new_group(eval_ranks, use_local_synchronization=True)
                dist.all_reduce(x, group=group)
        """,
        # a rank-local number stored on self does not make every test on self rank-local
        # (transformers' Trainer), and a None test asks whether a value was given
        """
        class Trainer:
            def log(self, loss, tokens, grad_norm=None):
                self.tokens_seen += tokens.sum().item()
                if grad_norm is None:
                    grad_norm = torch.linalg.vector_norm(tokens.float()).item()
                if self.should_evaluate:
                    dist.all_reduce(loss)
                if grad_norm is not None:
                    dist.all_reduce(loss)
                return grad_norm
        """,
        # a clock's decision broadcast through Lightning's strategy before the branch
        """
        def on_train_batch_end(trainer, last):
            skip = time.monotonic() - last < 60
            skip = trainer.strategy.broadcast(skip)
            if skip:
                return
            trainer.strategy.barrier()
        """,
        # a name bound to a rank's chunk at the end of a loop body, bound afresh at its start
        # (torch's fsdp/_optim_utils.py): the test in between reads this pass's value
        """
        def unflatten(states, rank):
            for name, state in states.items():
                value = state
                placement = value.placements[0]
                if placement != 0:
                    dist.all_reduce(value)
                value = chunk(value, rank)
        """,
    ],
)
def test_no_noise(tmp_path: Path, body: str) -> None:
    assert lint_source(tmp_path, HEADER + textwrap.dedent(body)) == []


def test_a_reduce_result_tested_on_every_rank_is_explained_and_a_broadcast_after_it_settles_it(
    tmp_path: Path,
) -> None:
    unsynced = """
        def should_stop(loss):
            dist.reduce(loss, dst=0)
            if loss.item() < 0.1:
                return True
            dist.barrier()
            return False
        """
    path = tmp_path / "train.py"
    path.write_text(HEADER + textwrap.dedent(unsynced))
    (finding,) = run_lint([path])[0]
    assert finding.cause == "unsynchronized-decision"
    reduce_line = 1 + HEADER.count("\n") + 2
    assert (
        f"`loss` holds the result of dist.reduce() at line {reduce_line}, which only its destination "
        "rank receives: the others test their own partial value" in finding.message
    )

    # rank 0's sum broadcast before the test: every rank decides on the same value
    settled = unsynced.replace(
        "dist.reduce(loss, dst=0)\n", "dist.reduce(loss, dst=0)\n            dist.broadcast(loss, src=0)\n"
    )
    assert lint_source(tmp_path, HEADER + textwrap.dedent(settled)) == []


def test_a_subgroup_collective_under_a_test_of_its_first_rank_is_still_found(tmp_path: Path) -> None:
    body = """
        def log_stage(x, stage_ranks):
            stage = dist.new_group(stage_ranks)
            if dist.get_rank(stage) == 0:
                dist.all_reduce(x, group=stage)
        """
    assert lint_source(tmp_path, HEADER + textwrap.dedent(body)) == [
        ("rank-conditional-collective", 9, "error")
    ]


def test_ignore_comments_silence_one_cause(tmp_path: Path) -> None:
    source = HEADER + textwrap.dedent(
        """
        def log(x):
            if dist.get_rank() == 0:  # ncclcheck: ignore[rank-conditional-collective]
                dist.all_reduce(x)

        def log2(x):
            if dist.get_rank() == 0:
                dist.all_reduce(x)  # ncclcheck: ignore[rank-early-exit]

        def log3(x):
            if dist.get_rank() == 0:
                dist.all_reduce(x)  # ncclcheck: ignore
        """
    )
    found = lint_source(tmp_path, source)
    # only log2's stays: its comment names another cause
    assert [cause for cause, _line, _sev in found] == ["rank-conditional-collective"]


# -- the command line --------------------------------------------------------------------


def ncclcheck(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ncclcheck", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        check=False,
    )


def test_text_output_is_path_line_col_cause_message() -> None:
    done = ncclcheck("lint", "playbooks/rank-early-exit/repro.py")
    assert done.returncode == 1
    line = PLAYBOOKS / "rank-early-exit"
    site = (line / "repro.py").read_text().splitlines()
    number = next(n for n, text in enumerate(site, 1) if "dist.barrier()  # nobody" in text)
    assert done.stdout.startswith(f"playbooks/rank-early-exit/repro.py:{number}:5: rank-early-exit: ")
    assert "1 error, 0 warnings in 1 file" in done.stderr


def test_warnings_alone_exit_0() -> None:
    done = ncclcheck("lint", "playbooks/missing-distributed-sampler/repro.py")
    assert done.returncode == 0, done.stderr
    assert ": missing-distributed-sampler: (warning) " in done.stdout


def test_json_follows_the_contract() -> None:
    done = ncclcheck("lint", "--json", "playbooks")
    assert done.returncode == 1
    report = json.loads(done.stdout)
    jsonschema.validate(report, SCHEMA)
    assert report["command"] == "lint" and report["verdict"] == "misaligned"
    causes = {f["cause"] for f in report["findings"]}
    assert {"rank-conditional-collective", "rank-early-exit", "missing-distributed-sampler"} <= causes
    assert all(f["fix"] for f in report["findings"])


def test_sarif_for_code_scanning() -> None:
    done = ncclcheck("lint", "--format", "sarif", "playbooks/rank-conditional-collective")
    sarif = json.loads(done.stdout)
    assert sarif["version"] == "2.1.0"
    run = sarif["runs"][0]
    rules = {rule["id"] for rule in run["tool"]["driver"]["rules"]}
    (result,) = run["results"]
    assert result["ruleId"] == "rank-conditional-collective" and result["ruleId"] in rules
    assert result["level"] == "error"
    location = result["locations"][0]["physicalLocation"]
    assert location["artifactLocation"]["uri"] == "playbooks/rank-conditional-collective/repro.py"
    assert location["region"]["startLine"] > 0


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing.py", "no such file or directory"),
        (lambda d: (d / "notes.txt").write_text("hello") and d / "notes.txt", "not a Python file"),
        (lambda d: (d / "broken.py").write_text("def f(:\n") and d / "broken.py", "syntax error"),
    ],
)
def test_bad_paths_are_one_line_and_exit_2(tmp_path: Path, make, message: str) -> None:  # type: ignore[no-untyped-def]
    path = make(tmp_path)
    done = ncclcheck("lint", str(path))
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


def test_folders_are_recursed(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "sub" / "eval.py").write_text(
        HEADER + "def f(x):\n    if dist.get_rank() == 0:\n        dist.all_reduce(x)\n"
    )
    (tmp_path / "pkg" / ".hidden").mkdir()
    (tmp_path / "pkg" / ".hidden" / "skip.py").write_text("def f(:\n")  # not read
    done = ncclcheck("lint", str(tmp_path / "pkg"))
    assert done.returncode == 1, done.stderr
    assert "eval.py:" in done.stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="pre-commit needs git")
def test_pre_commit_hook_with_try_repo(tmp_path: Path) -> None:
    pre_commit = Path(sys.executable).parent / "pre-commit"
    if not pre_commit.exists():
        pytest.skip("pre-commit is not installed")
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(
        HEADER + "def f(x):\n    if dist.get_rank() == 0:\n        dist.barrier()\n"
    )
    env = {
        **os.environ,
        "PRE_COMMIT_HOME": str(tmp_path / "cache"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    for command in (["git", "init", "-q"], ["git", "add", "train.py"]):
        subprocess.run(command, cwd=project, check=True, env=env, timeout=30)
    result = run_bounded(
        [str(pre_commit), "try-repo", str(REPO), "ncclcheck-lint", "--all-files"], 240, env=env, cwd=project
    )
    assert result.returncode == 1, result.output
    assert "train.py:7:9: rank-conditional-collective:" in result.output  # the barrier


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("local_rank not in (-1, 0)", "local_rank == 1"),  # rank 0 makes no barrier
        ("local_rank > 1", "local_rank == 0"),  # nor does rank 1
        ("local_rank != 0", "local_rank != 1"),  # ranks 2.. make two
    ],
)
def test_two_rank_tests_that_do_not_split_the_ranks_are_still_flagged(
    tmp_path: Path, first: str, second: str
) -> None:
    source = f"""
    import torch.distributed as dist

    def prepare(local_rank):
        if {first}:
            dist.barrier()
        if {second}:
            dist.barrier()
    """
    assert lint_source(tmp_path, source) == [
        ("rank-conditional-collective", 6, "error"),
        ("rank-conditional-collective", 8, "error"),
    ]


@pytest.mark.parametrize(
    ("imports", "call", "flagged"),
    [
        ("import torch.distributed.checkpoint as dcp", "dcp.save(state, checkpoint_id=path)", True),
        ("from torch.distributed import checkpoint as ckpt", "ckpt.load(state, checkpoint_id=path)", True),
        (
            "from torch.distributed.checkpoint import async_save",
            "async_save(state, checkpoint_id=path)",
            True,
        ),
        (
            "import torch.distributed.checkpoint",
            "torch.distributed.checkpoint.save(state, checkpoint_id=path)",
            True,
        ),
        # no_dist=True: one process, no collective
        (
            "import torch.distributed.checkpoint as dcp",
            "dcp.save(state, checkpoint_id=path, no_dist=True)",
            False,
        ),
        ("import torch", "torch.save(state, path)", False),
        (  # its state_dict helpers gather FSDP's shards
            "from torch.distributed.checkpoint.state_dict import get_model_state_dict",
            "torch.save(get_model_state_dict(state), path)",
            True,
        ),
        # a DTensor's gather (FSDP2, tensor parallelism)
        ("import torch", "torch.save({k: v.full_tensor() for k, v in state.items()}, path)", True),
    ],
)
def test_a_distributed_checkpoint_under_a_rank_test_is_flagged(
    tmp_path: Path, imports: str, call: str, flagged: bool
) -> None:
    source = f"""
    import torch
    import torch.distributed as dist
    {imports}

    def checkpoint(state, path):
        if dist.get_rank() == 0:
            {call}
    """
    expected = [("rank-conditional-collective", 8, "error")] if flagged else []
    assert lint_source(tmp_path, source) == expected


def test_accelerate_save_state_under_the_main_process_is_an_error_only_where_it_waits(tmp_path: Path) -> None:
    body = """
        from accelerate import Accelerator
        from accelerate.utils import ProjectConfiguration

        CONFIG = ProjectConfiguration(automatic_checkpoint_naming=AUTOMATIC)

        def save(accelerator):
            if accelerator.is_main_process:
                accelerator.save_state()
            accelerator.wait_for_everyone()
        """
    for automatic, severity in (("False", "warning"), ("True", "error")):
        source = HEADER + textwrap.dedent(body).replace("AUTOMATIC", automatic)
        found = [(cause, level) for cause, _line, level in lint_source(tmp_path, source)]
        assert found == [("rank-conditional-collective", severity)], automatic


# -- code as people write it: ranks from the environment, methods of the project's classes --

# Each shape broken as users report it, and fixed as the playbook says: every rank makes
# the call, only the side effect (print, torch.save) stays under the rank test.
ENV_CONSTANT = """
import os
import torch
import torch.distributed as dist

LOCAL_RANK = int(os.environ["LOCAL_RANK"])


def save_checkpoint(model, path):
    if LOCAL_RANK == 0:
        torch.save(model.state_dict(), path)
    dist.barrier()  # everyone waits for the file


def main(model):
    for epoch in range(3):
        train_one_epoch(model)
        {call}
"""
TRAINER = """
import os
import torch
import torch.distributed as dist


class Trainer:
    def __init__(self, model):
        self.model = model
        self.is_primary = int(os.getenv("RANK", "0")) == 0

    def save(self):
        if self.is_primary:
            torch.save(self.model.state_dict(), "last.pt")
        dist.barrier()

    def fit(self, epochs):
        for epoch in range(epochs):
            self.train_epoch()
            {call}
"""
METER = """
import os
import torch
import torch.distributed as dist


class AverageMeter:
    def __init__(self):
        self.total = torch.zeros(2)

    def all_reduce(self):
        dist.all_reduce(self.total)
        return self.total[0] / self.total[1]


class Evaluator:
    def __init__(self):
        self.meter = AverageMeter()
        self.rank = int(os.environ.get("SLURM_PROCID", 0))

    def report(self):
        {call}
"""
IMPORTED_METER = """
import os
from meters import AverageMeter


def validate(model, loader):
    meter = AverageMeter()
    for batch in loader:
        meter.update(model(batch).item())
    {call}
"""
METERS_MODULE = """
import torch
import torch.distributed as dist


class AverageMeter:
    def __init__(self):
        self.total = torch.zeros(2)

    def update(self, value):
        self.total += torch.tensor([value, 1.0])

    def all_reduce(self):
        dist.all_reduce(self.total)
        return self.total[0] / self.total[1]
"""
FABRIC = """
import torch
from lightning.fabric import Fabric


def main(model, optimizer, loader):
    fabric = Fabric(strategy="ddp")
    fabric.launch()
    model, optimizer = fabric.setup(model, optimizer)
    for epoch in range(3):
        for batch in loader:
            optimizer.zero_grad()
            fabric.backward(model(batch).sum())
            optimizer.step()
        {call}
"""
DEEPSPEED = """
import deepspeed


def train(model_engine, loader, rank):
    for step, batch in enumerate(loader):
        loss = model_engine(batch).sum()
        model_engine.backward(loss)
        model_engine.step()
        {call}
"""
RANK_FUNCTION = """
import os
import torch
import torch.distributed as dist


def process_id():
    return int(os.environ.get("RANK", "0"))


def first_process():
    return process_id() == 0


def average(value):
    dist.all_reduce(value)
    return value / dist.get_world_size()


def main(loss):
    {call}
"""
DIST_UTILS_MODULE = """
import os
from dataclasses import dataclass, field


def leader():
    return int(os.environ.get("RANK", "0")) == 0


@dataclass
class RunConfig:
    epochs: int = 3
    local_lead: bool = field(default_factory=lambda: int(os.environ["LOCAL_RANK"]) == 0)
"""
IMPORTED_HELPERS = """
import torch
import torch.distributed as dist
import dist_utils
from dist_utils import RunConfig, leader


def save(model):
    dist.barrier()  # every rank waits for the others before rank 0 writes
    torch.save(model.state_dict(), "ckpt.pt")


def main(model, loss):
    cfg = RunConfig()
    {call}
"""
CONFIG_FIELD = """
import os
from dataclasses import dataclass

import torch.distributed as dist


@dataclass
class TrainConfig:
    lr: float = 1e-3
    is_main: bool = int(os.getenv("RANK", "0")) == 0


def evaluate(cfg: TrainConfig, loss):
    {call}
"""
METRIC_COLLECTION = """
import torch
import torch.distributed as dist
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score


def validate(model, loader):
    metrics = MetricCollection([MulticlassAccuracy(num_classes=3), MulticlassF1Score(num_classes=3)])
    for inputs, labels in loader:
        metrics.update(model(inputs), labels)
    {call}
"""
SHAPES = {
    "imported-rank-function": (
        IMPORTED_HELPERS,
        "if leader():\n        save(model)",
        "dist.barrier()\n    if leader():\n        torch.save(model.state_dict(), 'ckpt.pt')",
    ),
    "imported-module-rank-function": (
        IMPORTED_HELPERS,
        "if dist_utils.leader():\n        save(model)",
        "save(model)",
    ),
    "imported-config-field": (
        IMPORTED_HELPERS,
        "if cfg.local_lead:\n        dist.all_reduce(loss)",
        "dist.all_reduce(loss)\n    if cfg.local_lead:\n        print(loss)",
    ),
    "config-field": (
        CONFIG_FIELD,
        "if cfg.is_main:\n        dist.all_reduce(loss)",
        "dist.all_reduce(loss)\n    if cfg.is_main:\n        print(loss)",
    ),
    "metric-collection": (
        METRIC_COLLECTION,
        "if dist.get_rank() == 0:\n        print(metrics.compute())",
        "scores = metrics.compute()\n    if dist.get_rank() == 0:\n        print(scores)",
    ),
    "rank-function": (
        RANK_FUNCTION,
        "if first_process():\n        print(average(loss))",
        "mean = average(loss)\n    if first_process():\n        print(mean)",
    ),
    "fabric-save": (
        FABRIC,
        'if fabric.global_rank == 0:\n            fabric.save("last.ckpt", {"model": model})',
        'fabric.save("last.ckpt", {"model": model})',
    ),
    "fabric-barrier": (
        FABRIC,
        'if fabric.is_global_zero:\n            print("epoch done")\n            fabric.barrier()',
        'if fabric.is_global_zero:\n            print("epoch done")\n        fabric.barrier()',
    ),
    "deepspeed-checkpoint": (
        DEEPSPEED,
        'if rank == 0 and step % 100 == 0:\n            model_engine.save_checkpoint("ckpt")',
        'if step % 100 == 0:\n            model_engine.save_checkpoint("ckpt")',
    ),
    "env-constant": (
        ENV_CONSTANT,
        'if LOCAL_RANK == 0:\n            save_checkpoint(model, f"ckpt-{epoch}.pt")',
        'save_checkpoint(model, f"ckpt-{epoch}.pt")',
    ),
    "trainer": (TRAINER, "if self.is_primary:\n                self.save()", "self.save()"),
    "meter": (
        METER,
        "if self.rank == 0:\n            print(self.meter.all_reduce())",
        "loss = self.meter.all_reduce()\n        if self.rank == 0:\n            print(loss)",
    ),
    "imported-meter": (
        IMPORTED_METER,
        'if int(os.environ["OMPI_COMM_WORLD_RANK"]) == 0:\n        print("val loss", meter.all_reduce())',
        "loss = meter.all_reduce()\n"
        '    if int(os.environ["OMPI_COMM_WORLD_RANK"]) == 0:\n'
        '        print("val loss", loss)',
    ),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_code_as_people_write_it_is_flagged_and_its_fix_is_clean(tmp_path: Path, shape: str) -> None:
    template, broken, fixed = SHAPES[shape]
    (tmp_path / "meters.py").write_text(METERS_MODULE)
    (tmp_path / "dist_utils.py").write_text(DIST_UTILS_MODULE)
    script = tmp_path / "train.py"
    script.write_text(template.replace("{call}", broken))
    findings, _ = run_lint([script])
    errors = [f for f in findings if f.severity == "error"]
    assert [f.cause for f in errors] == ["rank-conditional-collective"], (
        shape,
        [f.message for f in findings],
    )
    script.write_text(template.replace("{call}", fixed))
    findings, _ = run_lint([script])
    assert not [f for f in findings if f.severity == "error"], (shape, [f.message for f in findings])


EARLY_STOP = """
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main(net, loader, sync_now):
    model = DDP(net)
    for epoch in range(50):
        total = torch.zeros(1)
        for features in loader:
            loss = model(features).mean()
            loss.backward()
            total += loss.detach()
        train_loss = total.item() / len(loader)
        {sync}
        if train_loss < 0.4:
            break
    dist.barrier()
"""


@pytest.mark.parametrize(
    ("sync", "flagged"),
    [
        ("pass", True),  # each rank stops on its own loss
        # replaced by the all-reduced mean before the test: every rank tests the same value
        (
            "mean = torch.tensor(train_loss)\n        dist.all_reduce(mean)\n"
            "        train_loss = mean.item() / dist.get_world_size()",
            False,
        ),
        # replaced on one path only: the local value still reaches the test on the other
        (
            "if sync_now:\n            mean = torch.tensor(train_loss)\n            dist.all_reduce(mean)\n"
            "            train_loss = mean.item() / dist.get_world_size()",
            True,
        ),
    ],
)
def test_a_decision_is_judged_by_the_value_that_reaches_its_test(
    tmp_path: Path, sync: str, flagged: bool
) -> None:
    script = tmp_path / "train.py"
    script.write_text(EARLY_STOP.replace("{sync}", sync))
    findings, _ = run_lint([script])
    assert bool(findings) is flagged, [f.message for f in findings]
    if flagged:
        assert {f.cause for f in findings} == {"unsynchronized-decision"}, [f.message for f in findings]


EPOCH_MEAN = """
import math

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def fit(net, loader, target):
    model = DDP(net)
    for epoch in range(50):
        running, batches = 0.0, 0
        for features in loader:
            loss = model(features).mean()
            {in_the_loop}
            loss.backward()
            running += loss.item()
            batches += 1
        {after}
        mean = running / max(batches, 1)
        if math.isfinite(mean) and mean < target:
            break
"""


@pytest.mark.parametrize(
    ("in_the_loop", "after", "causes"),
    [
        # a data test in form, read on a total of the epoch's batches: a decision of the rank's own
        ("pass", "pass", {"unsynchronized-decision"}),
        # the sum and the count all-reduced first: every rank stops at the same epoch
        (
            "pass",
            "totals = torch.tensor([running, batches])\n        dist.all_reduce(totals)\n"
            "        running, batches = totals.tolist()",
            set(),
        ),
        # a test of the batch at hand, in the loop: data, whatever the epoch's test is
        (
            "if not torch.isfinite(loss):\n                continue",
            "totals = torch.tensor([running, batches])\n        dist.all_reduce(totals)\n"
            "        running, batches = totals.tolist()",
            {"data-dependent-branch"},
        ),
    ],
)
def test_a_test_on_a_total_of_the_loop_it_is_past_is_a_decision_not_a_test_of_the_batch(
    tmp_path: Path, in_the_loop: str, after: str, causes: set[str]
) -> None:
    script = tmp_path / "fit.py"
    script.write_text(EPOCH_MEAN.replace("{in_the_loop}", in_the_loop).replace("{after}", after))
    findings, _ = run_lint([script])
    assert {f.cause for f in findings} == causes, [f.message for f in findings]


TRACKER = """
import torch
import torch.distributed as dist


class BestTracker:
    def __init__(self, rank):
        self.rank = rank
        self.total, self.count, self.best, self.last_was_best = 0.0, 0, None, False

    def add(self, value):
        self.total += value
        self.count += 1

    def close_epoch(self):
        mean = {mean}
        self.last_was_best = self.best is None or mean < self.best
        self.best = mean if self.last_was_best else self.best
        self.total, self.count = 0.0, 0

    def is_best(self):
        return self.last_was_best


def save(model):
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), "best.pt")
    dist.barrier()


def fit(model, loader, rank):
    tracker = BestTracker(rank)
    for epoch in range(10):
        for x in loader:
            tracker.add(model(x).mean().item())
        tracker.close_epoch()
        if tracker.is_best():
            save(model)
"""


@pytest.mark.parametrize(
    ("mean", "causes"),
    [
        # each rank's own mean: built with the rank, the tracker is no rank test; fed this
        # rank's values, it answers with them
        ("self.total / max(self.count, 1)", {"unsynchronized-decision"}),
        # the tracker all-reduces what it was fed: every rank gets the same answer
        (
            "self._reduced_mean()\n\n    def _reduced_mean(self):\n"
            "        t = torch.tensor([self.total, float(self.count)])\n        dist.all_reduce(t)\n"
            "        return (t[0] / t[1].clamp(min=1)).item()",
            set(),
        ),
    ],
)
def test_a_test_asking_a_tracker_the_scope_fed_its_own_values_is_a_decision_not_a_rank_test(
    tmp_path: Path, mean: str, causes: set[str]
) -> None:
    script = tmp_path / "fit.py"
    script.write_text(TRACKER.replace("{mean}", mean))
    findings, _ = run_lint([script])
    assert {f.cause for f in findings} == causes, [f.message for f in findings]


def test_the_real_scripts_are_flagged_and_their_fixes_are_clean() -> None:
    """tests/scripts/real: the early stop on an all-reduced loss, the step skipped on a
    flag fabric.all_reduce returned: what a collective returns is every rank's."""
    real = REPO / "tests" / "scripts" / "real"
    for broken in sorted(real.glob("*.py")):
        if broken.stem.endswith("_fixed"):
            continue
        findings, _ = run_lint([broken])
        assert findings, broken.name
        findings, _ = run_lint([real / f"{broken.stem}_fixed.py"])
        assert findings == [], (broken.name, [f.message for f in findings])
    findings, _ = run_lint([real / "early_stop_on_local_loss.py"])
    assert [f.cause for f in findings if f.severity == "error"] == ["rank-early-exit"]


def test_a_collective_reached_through_a_call_names_that_call_too(tmp_path: Path) -> None:
    """The collective's place is where lint sites the finding; the guarded call in the
    checked file, where the fix goes, follows as a compiler's note and as SARIF's
    related location."""
    from ncclcheck.catalogue import load_catalogue
    from ncclcheck.render import lint as render

    (tmp_path / "dist_utils.py").write_text(DIST_UTILS_MODULE)
    script = tmp_path / "train.py"
    script.write_text(IMPORTED_HELPERS.replace("{call}", "if leader():\n        save(model)"))
    findings, _ = run_lint([script])
    assert len(findings) == 1, [f.message for f in findings]
    barrier = (
        IMPORTED_HELPERS.splitlines().index(
            "    dist.barrier()  # every rank waits for the others before rank 0 writes"
        )
        + 1
    )
    lines = render.text_lines(findings)
    assert lines[0].split(":")[1:3] == [str(barrier), "5"], lines
    written = script.read_text().splitlines()
    test_line = written.index("    if leader():") + 1
    assert lines[1].endswith(
        f":{test_line + 1}:1: note: the call that reaches it, under the test at line {test_line}"
    )
    (result,) = render.sarif(findings, load_catalogue())["runs"][0]["results"]
    (related,) = result["relatedLocations"]
    assert related["physicalLocation"]["region"] == {"startLine": test_line + 1}
    assert related["physicalLocation"]["artifactLocation"]["uri"].endswith("train.py")


# -- collectives reached without a call in the source ------------------------------------

_METER = """
    import logging
    import torch
    import torch.distributed as dist

    log = logging.getLogger(__name__)


    class Meter:
        def __init__(self):
            self.total = torch.zeros(2)

        @property
        def global_avg(self):
            t = self.total.clone()
            dist.all_reduce(t)
            return (t[0] / t[1]).item()

        @property
        def local_avg(self):
            return (self.total[0] / self.total[1]).item()

        def __str__(self):
            return f"{self.global_avg:.4f}"

        def __repr__(self):
            return f"Meter({self.local_avg})"


    def train(rank):
        meter = Meter()
        for step in range(100):
            if rank == 0:
                {use}
"""


@pytest.mark.parametrize(
    "use",
    [
        'print(f"step {step}: loss {meter}")',  # __format__ -> __str__ -> global_avg
        "print(meter)",  # __str__
        'log.info("loss %s", meter)',  # a logger formats its arguments with __str__
        "value = meter.global_avg",  # a property read
    ],
)
def test_a_collective_reached_through_formatting_or_a_property_under_a_rank_test_is_found(
    tmp_path: Path, use: str
) -> None:
    found = lint_source(tmp_path, _METER.replace("{use}", use))
    assert found == [("rank-conditional-collective", 16, "error")], found  # the all_reduce in global_avg


@pytest.mark.parametrize(
    "use",
    [
        'print(f"step {step}: loss {meter!r}")',  # __repr__ reads local_avg: no collective
        "value = meter.local_avg",  # a property that does not communicate
        'print(f"step {step}: loss {step}")',  # nothing of the meter
    ],
)
def test_formatting_or_properties_that_do_not_communicate_are_not_found(tmp_path: Path, use: str) -> None:
    assert lint_source(tmp_path, _METER.replace("{use}", use)) == []


def test_formatting_a_meter_on_every_rank_is_aligned(tmp_path: Path) -> None:
    source = _METER.replace(
        "            if rank == 0:\n                {use}", '            print(f"{meter}")'
    )
    assert lint_source(tmp_path, source) == []


_TRACKER = """
    from collections import defaultdict

    import torch
    import torch.distributed as dist


    class Avg:
        def __init__(self):
            self.sum, self.n = 0.0, 0

        def synced(self):
            t = torch.tensor([self.sum, float(self.n)])
            dist.all_reduce(t)
            return t[0].item() / max(t[1].item(), 1.0)

        def __format__(self, spec):
            return format(self.synced(), spec)


    class Tracker:
        def __init__(self, names):
            {stats}

        def line(self):
            {line}
            return text


    def fit(rank):
        tracker = Tracker(["loss", "acc"])
        for step in range(10):
            if rank == 0:
                print(tracker.line())
"""


@pytest.mark.parametrize(
    "stats, line",
    [
        (
            "self.stats = {n: Avg() for n in names}",
            'text = " ".join(f"{k}={v:.3f}" for k, v in self.stats.items())',
        ),
        ("self.stats = [Avg() for _ in names]", 'text = ", ".join(f"{a:.2f}" for a in self.stats)'),
        ("self.stats = {'loss': Avg(), 'acc': Avg()}", "text = f\"{self.stats['loss']:.4f}\""),
        ("self.stats: dict[str, Avg] = {}", 'text = "|".join(f"{a:.1f}" for a in self.stats.values())'),
        (
            "self.stats = defaultdict(Avg)",
            'text = " ".join(f"{i}:{m:.2f}" for i, m in enumerate(self.stats))',
        ),
    ],
)
def test_meters_held_in_a_container_are_followed_into_their_formatting(
    tmp_path: Path, stats: str, line: str
) -> None:
    source = _TRACKER.replace("{stats}", stats).replace("{line}", line)
    assert lint_source(tmp_path, source) == [("rank-conditional-collective", 14, "error")]


def test_a_container_of_meters_formatted_on_every_rank_is_aligned(tmp_path: Path) -> None:
    source = _TRACKER.replace("{stats}", "self.stats = {n: Avg() for n in names}").replace(
        "{line}", 'text = " ".join(f"{k}={v:.3f}" for k, v in self.stats.items())'
    )
    source = source.replace("            if rank == 0:\n                print", "            print")
    assert lint_source(tmp_path, source) == []


SKIP_ON_NONFINITE = """
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def every_rank_agrees(flag):
    t = torch.tensor(float(flag))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def train(net, batches):
    model = DDP(net)
    for x in batches:
        loss = model(x).sum()
        if {test}:
            continue
        loss.backward()
"""


def test_a_skip_whose_test_communicates_is_agreed_on_and_the_same_test_alone_is_not(tmp_path: Path) -> None:
    # the flag all-reduced inside the test (a helper of the project): the same answer everywhere
    agreed = "every_rank_agrees(not torch.isfinite(loss).item())"
    assert lint_source(tmp_path, SKIP_ON_NONFINITE.replace("{test}", agreed)) == []
    alone = lint_source(tmp_path, SKIP_ON_NONFINITE.replace("{test}", "not torch.isfinite(loss).item()"))
    assert [cause for cause, _line, _severity in alone] == ["data-dependent-branch"]


SHARDED_PREVIEW = """\
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

def preview(model, samples):
    with torch.no_grad():
        return model(samples)

def main(model, samples):
    fully_shard(model)
    {call}
"""


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (
            "if dist.get_rank() == 0:\n        preview(model, samples)",
            [("rank-conditional-collective", 7, "error")],
        ),
        ("preview(model, samples)", []),  # every rank runs the forward
        ("if dist.get_rank() == 0:\n        print(samples.shape)", []),
    ],
    ids=["under-a-rank-test", "on-every-rank", "no-forward"],
)
def test_a_sharded_models_forward_under_a_rank_test_is_a_rank_conditional_collective(
    tmp_path: Path, call: str, expected: list[tuple[str, int, str]]
) -> None:
    # fully_shard makes every forward all-gather the parameters: followed into the helper
    assert lint_source(tmp_path, SHARDED_PREVIEW.format(call=call)) == expected


def test_a_deepspeed_engines_forward_on_rank_zero_alone_is_named_as_a_sharded_forward(tmp_path: Path) -> None:
    source = """\
    import deepspeed
    import torch.distributed as dist

    def main(model, config, sample):
        zero3 = {"zero_optimization": {"stage": 3}}
        engine, optimizer, _, _ = deepspeed.initialize(model=model, config=zero3)
        if dist.get_rank() == 0:
            engine(sample)
    """
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(source))
    findings, _ = run_lint([path])
    (finding,) = findings
    assert (finding.cause, finding.location.line, finding.severity) == (
        "rank-conditional-collective",
        8,
        "error",
    )
    assert "forward of a sharded model" in finding.message


def test_a_count_kept_under_a_test_on_a_local_loss_is_local_too(tmp_path: Path) -> None:
    # `bad` is only ever 0 or bad + 1, but which depends on each rank's own loss
    source = """\
    import torch.distributed as dist

    def evaluate(model):
        return model().item()

    def main(model, patience):
        best, bad = float("inf"), 0
        for epoch in range(100):
            dist.all_reduce(model.grad)
            loss = evaluate(model)
            if loss < best:
                best, bad = loss, 0
            else:
                bad += 1
            if bad >= patience:
                break
    """
    assert lint_source(tmp_path, source) == [("unsynchronized-decision", 9, "warning")]
    synced = source.replace(
        "return model().item()",
        "value = model()\n        dist.all_reduce(value)\n        return value.item()",
    )
    assert lint_source(tmp_path, synced) == []


LIGHTNING_STEP = """\
import lightning.pytorch as pl
import torch

class Tagger(pl.LightningModule):
    def __init__(self):
        super().__init__()
        {manual}

    def training_step(self, batch, batch_idx):
        tokens, labels = batch
        if {test}:
            return {returned}
        return self.net(tokens).sum()
"""


@pytest.mark.parametrize(
    ("manual", "test", "returned", "expected"),
    [
        # Lightning backs the returned loss and DDP all-reduces its gradients: a rank that
        # returns nothing skips that (and, under DDP, Lightning raises there)
        ("", "torch.isnan(tokens).any()", "None", [("data-dependent-branch", 12, "warning")]),
        ("", "labels.sum() == 0", "", [("data-dependent-branch", 12, "warning")]),
        # a loss returned on both sides keeps the step
        ("", "labels.sum() == 0", "tokens.sum() * 0.0", []),
        # under manual optimisation the user calls backward: nothing after the return
        ("self.automatic_optimization = False", "labels.sum() == 0", "None", []),
        # a test on a Python value alike on every rank (the epoch) decides alike
        ("", "self.current_epoch == 0", "None", []),
    ],
    ids=["nan-none", "empty-bare", "zero-loss", "manual", "epoch"],
)
def test_a_lightning_training_step_that_returns_nothing_on_a_ranks_own_data_skips_the_backward(
    tmp_path: Path, manual: str, test: str, returned: str, expected: list[tuple[str, int, str]]
) -> None:
    source = LIGHTNING_STEP.format(manual=manual, test=test, returned=returned)
    assert lint_source(tmp_path, source) == expected


def test_a_training_step_of_a_class_that_is_no_lightning_module_is_no_step_hook(tmp_path: Path) -> None:
    source = LIGHTNING_STEP.replace("pl.LightningModule", "object").format(
        manual="", test="torch.isnan(tokens).any()", returned="None"
    )
    assert lint_source(tmp_path, source) == []


@pytest.mark.parametrize(
    ("test", "kind"),
    [
        ("mask.sum() == 0", "data"),
        ("torch.max(scores) > 10", "data"),
        ("sum(counts) == 0", "other"),  # the builtin: a list's sum
        ("math.prod(shape) > 4", "other"),
    ],
)
def test_a_reduction_of_a_tensor_in_a_test_reads_the_data(test: str, kind: str) -> None:
    from ncclcheck.source.reading import kind_of

    assert kind_of(ast.parse(test, mode="eval").body, set()) == kind


CALLBACK_ON_A_LOCAL_ATTRIBUTE = """\
import lightning.pytorch as pl
import torch

class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.losses = []
        self.val_loss = float("inf")

    def on_validation_epoch_end(self):
        self.val_loss = {value}
        self.losses.clear()

class SaveBest(pl.Callback):
    def __init__(self):
        self.best = float("inf")

    def on_validation_end(self, trainer, pl_module):
        current = pl_module.val_loss
        if current < self.best:
            self.best = current
            trainer.save_checkpoint("best.ckpt")
"""


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # each rank's own mean, read by another object's method
        ("torch.stack(self.losses).mean().item()", [("unsynchronized-decision", 22, "warning")]),
        # the metric Lightning synchronised: the same on every rank
        ("self.trainer.callback_metrics['val_loss']", []),
    ],
    ids=["own-mean", "synced-metric"],
)
def test_an_attribute_set_only_from_a_ranks_own_value_is_rank_local_wherever_read(
    tmp_path: Path, value: str, expected: list[tuple[str, int, str]]
) -> None:
    assert lint_source(tmp_path, CALLBACK_ON_A_LOCAL_ATTRIBUTE.format(value=value)) == expected


TRAINER_WITH_A_TOKEN_BUDGET = """\
import torch
import torch.distributed as dist

class Trainer:
    def __init__(self, model, loader, budget):
        self.model, self.loader, self.budget = model, loader, budget
        self.tokens_seen = 0

    def fit(self):
        for batch in self.loader:
            loss = self.model(batch).mean()
            loss.backward()
            dist.all_reduce(loss)
            count = {count}
            self.tokens_seen += count
            if self.tokens_seen >= self.budget:
                break
"""


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        # each rank's own batch, made a Python number by int() as .item() would
        ('int(batch["attention_mask"].sum())', [("unsynchronized-decision", 13, "warning")]),
        ('float(batch["attention_mask"].sum().item())', [("unsynchronized-decision", 13, "warning")]),
        # the same count on every rank: a reduction of what was all-reduced, or a length
        ("int(loss.sum())", []),
        ("int(len(self.loader))", []),
    ],
    ids=["int-of-a-reduction", "item", "synced", "length"],
)
def test_a_counter_kept_on_self_from_each_ranks_own_batch_decides_on_a_local_value(
    tmp_path: Path, count: str, expected: list[tuple[str, int, str]]
) -> None:
    """``self.tokens_seen += int(batch[...].sum())``: an attribute set only from a rank's
    own value is rank-local where a test reads it, and a break under that test skips the
    collectives of the passes after it."""
    assert lint_source(tmp_path, TRAINER_WITH_A_TOKEN_BUDGET.format(count=count)) == expected


TIME_BUDGET_BY_A_HELPER = """\
import time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

def out_of_time(start):
    flag = torch.tensor([int(time.time() - start > 5)])
    dist.all_reduce({synced}, op=dist.ReduceOp.MAX)
    return {returned}

def main(loader):
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(2, 2))
    start = time.time()
    step, stop = 0, False
    for epoch in range(3):
        for (x,) in loader:
            loss = model(x).mean()
            loss.backward()
            if out_of_time(start):
                stop = True
                break
        if stop:
            break
"""


@pytest.mark.parametrize(
    ("synced", "returned", "expected"),
    [
        # fresh w06: the helper all-reduces the flag it returns, MAX over ranks
        ("flag", "bool(flag.item())", []),
        # it all-reduces something else and returns its own clock's reading
        ("torch.zeros(1)", "bool(flag.item())", [("unsynchronized-decision", 19, "warning")]),
        ("flag", "time.time() - start > 5", [("unsynchronized-decision", 19, "warning")]),
    ],
    ids=["returns-what-it-reduced", "reduces-something-else", "returns-its-clock"],
)
def test_a_helper_that_returns_what_it_synchronised_settles_what_it_was_given(
    tmp_path: Path, synced: str, returned: str, expected: list[tuple[str, int, str]]
) -> None:
    """``if out_of_time(start): break`` with ``start = time.time()``: the clock goes in, but
    what comes out was all-reduced inside; the ranks take the break together."""
    assert lint_source(tmp_path, TIME_BUDGET_BY_A_HELPER.format(synced=synced, returned=returned)) == expected


def test_a_model_wrapped_in_ddp_on_an_attribute_makes_backward_a_collective(tmp_path: Path) -> None:
    # the wrapper held by `self.net`, never by a plain name: its backward still all-reduces
    found = lint_source(
        tmp_path,
        """
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        class Fitter:
            def __init__(self, net):
                self.net = DDP(net)

            def one_step(self, batch):
                loss = self.net(batch).mean()
                loss.backward()

            def epoch(self, batches):
                for batch in batches:
                    try:
                        self.one_step(batch)
                    except ValueError:
                        continue
        """,
    )
    assert found == [("rank-exception", 11, "warning")]


def test_a_tensor_built_from_a_data_sized_one_keeps_its_size_unless_padded(tmp_path: Path) -> None:
    found = lint_source(
        tmp_path,
        """
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F

        def gather_hits(scores, ids, world):
            hit = scores > 0.5
            top, kept_ids = scores[hit], ids[hit].long()
            rows = torch.stack([top, kept_ids.float()], dim=1)
            out = [torch.zeros_like(rows) for _ in range(world)]
            dist.all_gather(out, rows)

        def gather_hits_padded(scores, ids, world, longest):
            hit = scores > 0.5
            top = scores[hit]
            count = torch.tensor([len(top)])
            padded = F.pad(top, (0, longest - top.shape[0]))
            out = [torch.zeros_like(padded) for _ in range(world)]
            dist.all_gather(out, padded)
            dist.all_reduce(count)
        """,
    )
    assert found == [("collective-shape-mismatch", 11, "warning")]


def test_a_counter_an_attribute_keeps_from_a_local_metric_decides_per_rank(tmp_path: Path) -> None:
    # the metric reaches the test through a dict filled in place and a counter on self
    # bumped under a test of it: each rank's own count
    source = """
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        class Loop:
            def __init__(self, net):
                self.net = DDP(net)
                self.stale = 0
                self.best = float("inf")

            def one_epoch(self, batches):
                for batch in batches:
                    self.net(batch).mean().backward()

            def score(self, batches):
                return {"err": sum(self.net.module(b).mean().item() for b in batches)}

            def run(self, batches, epochs):
                for _ in range(epochs):
                    stats = {}
                    self.one_epoch(batches)
                    stats.update(self.score(batches))
                    if stats["err"] < self.best:
                        self.best, self.stale = stats["err"], 0
                    else:
                        self.stale += 1
                    if self.stale >= 3:
                        break
        """
    assert lint_source(tmp_path, source) == [("unsynchronized-decision", 13, "warning")]
    # the metric all-reduced before it is stored: the same count on every rank
    synced = source.replace(
        'return {"err": sum(self.net.module(b).mean().item() for b in batches)}',
        "err = torch.tensor(sum(self.net.module(b).mean().item() for b in batches))\n"
        "                dist.all_reduce(err)\n"
        '                return {"err": err.item()}',
    ).replace("import torch.distributed as dist", "import torch\n        import torch.distributed as dist")
    assert lint_source(tmp_path, synced) == []


def test_the_cat_of_a_list_a_loop_fills_with_masked_pieces_has_the_datas_size(tmp_path: Path) -> None:
    found = lint_source(
        tmp_path,
        """
        import torch
        import torch.distributed as dist

        def collect(model, batches, world):
            kept = []
            for x, mask in batches:
                kept.append(model(x)[mask.bool()])
            mine = torch.cat(kept).unsqueeze(0)
            out = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather(out, mine)
        """,
    )
    assert found == [("collective-shape-mismatch", 11, "warning")]


def test_a_while_bound_computed_from_the_ranks_shard_length_many_steps_down_is_an_early_exit(
    tmp_path: Path,
) -> None:
    """rank -> shard size -> dataset -> loader -> len(): five bindings written top to bottom,
    all followed; the loop runs on every rank and ends sooner on some."""
    source = """
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

def main():
    rank = dist.get_rank()
    records = 64 + 16 * (1 - rank)
    shard = TensorDataset(torch.randn(records, 4))
    loader = DataLoader(shard, batch_size=8)
    steps_per_epoch = len(loader)
    max_steps = 3 * steps_per_epoch
    step = 0
    while step < max_steps:
        dist.all_reduce(torch.ones(1))
        step += 1
"""
    found = lint_source(tmp_path, source)
    assert ("rank-early-exit", 15, "error") in found, found


def test_a_test_on_a_value_the_branch_itself_reduces_is_a_data_test(tmp_path: Path) -> None:
    """The all_reduce inside the branch does not make the value tested before it agree."""
    source = """
import torch
import torch.distributed as dist

def train(model, batches):
    for x in batches:
        loss = model(x).sum()
        if loss.item() > 10.0:
            dist.all_reduce(loss)
        reduced = loss.detach()
        dist.all_reduce(reduced)
        if reduced.item() > 10.0:
            dist.barrier()
"""
    found = lint_source(tmp_path, source)
    assert ("data-dependent-branch", 9, "warning") in found, found
    assert not any(line == 13 for _, line, _ in found), found  # reduced before it is tested


def test_a_value_the_rank_only_places_on_a_device_is_the_datas_not_the_ranks(tmp_path: Path) -> None:
    """A loss computed on rank r's GPU tests the data; the device itself stays a rank value."""
    source = """
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

def main(local_rank):
    device = torch.device("cuda", local_rank)
    model = DDP(torch.nn.Linear(4, 1).to(device), device_ids=[local_rank])
    for step in range(10):
        x = torch.randn(8, 4, device=device)
        loss = model(x.cuda(local_rank)).sum()
        if loss.item() > 10:
            dist.all_reduce(loss)
        if device.index == 0:
            dist.barrier()
"""
    found = lint_source(tmp_path, source)
    assert ("data-dependent-branch", 13, "warning") in found, found
    assert ("rank-conditional-collective", 15, "error") in found, found


def test_a_loop_bound_from_a_distributed_samplers_loader_is_the_same_on_every_rank(tmp_path: Path) -> None:
    """rank= picks the shard; DistributedSampler pads every shard to one length."""
    source = """
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

def main(rank, world):
    ds = TensorDataset(torch.randn(100, 4))
    loader = DataLoader(ds, batch_size=8, sampler=DistributedSampler(ds, num_replicas=world, rank=rank))
    steps = len(loader)
    step = 0
    while step < steps:
        dist.all_reduce(torch.ones(1))
        step += 1
"""
    assert lint_source(tmp_path, source) == []


def test_a_shard_given_to_a_class_from_the_rank_bounds_its_methods_loop(tmp_path: Path) -> None:
    """The rank reaches the loop through a keyword of the constructor, an attribute set in
    __init__, a method that builds the loader, and len() in another method."""
    source = """
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

class Fitter:
    def __init__(self, model, records=None):
        self.model = model
        self.records = records

    def batches(self):
        return DataLoader(self.records, batch_size=4, drop_last=True)

    def fit(self, epochs):
        total = epochs * len(self.batches())
        done = 0
        while done < total:
            dist.all_reduce(torch.ones(1))
            done += 1

def read_shard(path, rank):
    return torch.load(f"{path}/part-{rank:05d}.pt")

def main(path):
    rank = dist.get_rank()
    Fitter(torch.nn.Linear(2, 2), records=read_shard(path, rank)).fit(3)
"""
    found = lint_source(tmp_path, source)
    assert ("rank-early-exit", 18, "error") in found, found
    # the same class given one set on every rank: nothing to say
    assert (
        lint_source(tmp_path, source.replace("records=read_shard(path, rank)", "records=torch.load(path)"))
        == []
    )


def test_a_test_that_broadcasts_rank_0s_verdict_is_agreed_though_it_is_given_the_rank(tmp_path: Path) -> None:
    """`clock.expired(rank)` decides on rank 0 and broadcasts the flag: every rank breaks
    together (bound through a tuple assignment, as people write it)."""
    source = """
import time
import torch
import torch.distributed as dist

class Deadline:
    def __init__(self, seconds):
        self.seconds, self.start = seconds, time.monotonic()

    def expired(self, rank):
        flag = torch.tensor([float(rank == 0 and time.monotonic() - self.start > self.seconds)])
        dist.broadcast(flag, src=0)
        return bool(flag.item())

def train(rank, batches):
    clock, seen = Deadline(600), 0
    for batch in batches:
        dist.all_reduce(batch)
        seen += 1
        if clock.expired(rank):
            break
    dist.barrier()
"""
    assert lint_source(tmp_path, source) == []
    # the same test without the broadcast: each rank's own clock
    unsynced = source.replace("        dist.broadcast(flag, src=0)\n", "")
    assert [cause for cause, _, _ in lint_source(tmp_path, unsynced)], lint_source(tmp_path, unsynced)


def test_a_loop_over_an_attribute_built_from_a_modules_set_has_each_processs_order(tmp_path: Path) -> None:
    """`self.sums` is made in __init__ by a comprehension over a module-level set of names;
    sync() all-reduces it item by item in another method."""
    source = """
import torch
import torch.distributed as dist

COUNTERS = {"tokens", "pad_tokens", "sequences"}

class Meter:
    def __init__(self):
        self.sums = {key: torch.zeros(1) for key in COUNTERS}

    def sync(self):
        for key, total in self.sums.items():
            dist.all_reduce(total)
"""
    found = lint_source(tmp_path, source)
    assert ("collective-order-mismatch", 13, "warning") in found, found
    # built from a list: one order everywhere (another file: the source reader caches by path)
    listed = source.replace('{"tokens", "pad_tokens", "sequences"}', '["tokens", "pad"]')
    assert lint_source(tmp_path, listed, name="listed.py") == []


# -- what a class's instances are, where nothing names their class ---------------------


_CALLBACK_TRAINER = """
    import torch
    import torch.distributed as dist


    class Runner:
        def __init__(self, model):
            self.model = model
            self.global_rank = dist.get_rank()
            self.cache = {}

        @property
        def leads(self):
            return self.global_rank == 0

        def score(self):
            total = torch.zeros(2)
            dist.all_reduce(total)
            return total

        def metric(self, name):
            if name not in self.cache:
                self.cache[name] = self.score()
            return self.cache[name]


    class BestKeeper:
        def after_epoch(self, runner):
            if not runner.leads:
                return
            torch.save(runner.model.state_dict(), f"best-{runner.metric('acc')}.pt")


    class Plotter:
        def after_epoch(self, runner):
            if dist.get_rank() == 0:
                print(runner.metric("acc"))
"""


def test_a_callbacks_parameter_is_the_class_whose_members_it_uses(tmp_path: Path) -> None:
    """``runner`` has no annotation and no binding: the one class of the file with every
    member the callback reads on it (``leads``, ``model``, ``metric``) is its class; its
    property built on ``self.global_rank`` is a rank test, and ``metric()`` reaches the
    all-reduce. Two callbacks that call it under a rank test are two findings."""
    found = lint_source(tmp_path, _CALLBACK_TRAINER)
    assert ("rank-early-exit", 18, "error") in found  # BestKeeper, its return at the rank test
    assert ("rank-conditional-collective", 18, "error") in found  # Plotter's if
    assert len(found) == 2


def test_a_parameter_two_classes_fit_is_left_unresolved(tmp_path: Path) -> None:
    source = (
        _CALLBACK_TRAINER
        + """

    class Replay:
        model = None

        def leads(self):
            return True

        def metric(self, name):
            return 0.0
    """
    )
    found = lint_source(tmp_path, source)
    # BestKeeper's runner could be a Replay: its test is no known rank test; Plotter's
    # dist.get_rank() is one, but which metric() it calls is unknown: no finding either way
    assert found == []


def test_a_stateful_instance_called_on_a_ranks_own_value_is_an_unsynchronized_decision(
    tmp_path: Path,
) -> None:
    """``stopper(val_loss.item())`` runs the class's ``__call__`` (a patience count): a
    decision on what this rank has seen, not a test of the data; accelerate's ``reduce``
    returns the mean on every rank and leaves ``val_loss`` as it was (not dist.reduce)."""
    found = lint_source(
        tmp_path,
        """
        import torch
        from accelerate import Accelerator


        class Patience:
            def __init__(self, limit):
                self.limit, self.best, self.bad = limit, float("inf"), 0

            def __call__(self, value):
                self.bad = 0 if value < self.best else self.bad + 1
                self.best = min(self.best, value)
                return self.bad >= self.limit


        def main():
            accelerator = Accelerator()
            model, loader = accelerator.prepare(torch.nn.Linear(2, 1), [torch.zeros(2)])
            stopper = Patience(3)
            for epoch in range(50):
                for x in loader:
                    accelerator.backward(model(x).sum())
                val_loss = model(torch.ones(2)).sum()
                print(accelerator.reduce(val_loss).item())
                if stopper(val_loss.item()):
                    break
        """,
    )
    assert found == [("unsynchronized-decision", 22, "warning")]


def test_an_elif_that_denies_a_rank_free_part_of_the_if_is_decided_by_its_own_test(tmp_path: Path) -> None:
    """``elif in_order:`` holds only where ``not in_order`` failed: the if was false on every
    rank there, whatever ``is_main`` said; a plain ``else`` is still under the rank test."""
    found = lint_source(
        tmp_path,
        """
        import torch.distributed as dist


        def say(text, in_order=False):
            is_main = dist.get_rank() == 0
            if not in_order and is_main:
                print(text)
            elif in_order:
                for _ in range(dist.get_world_size()):
                    dist.barrier()


        def shout(text, in_order=False):
            is_main = dist.get_rank() == 0
            if not in_order and is_main:
                print(text)
            else:
                dist.barrier()
        """,
    )
    assert [(cause, line) for cause, line, _ in found] == [("rank-conditional-collective", 19)]


def test_a_handler_that_returns_or_continues_skips_the_collectives_after_its_try(tmp_path: Path) -> None:
    """``except ...: return None`` in a manual-optimisation training_step skips the
    manual_backward the other ranks' DDP sync waits in; ``except ...: continue`` in a loop
    skips the all-reduce after the try. The except is the deciding line."""
    found = lint_source(
        tmp_path,
        """
        import lightning as L
        import torch
        import torch.distributed as dist


        class Tagger(L.LightningModule):
            def training_step(self, batch, batch_idx):
                try:
                    loss = self(batch).sum()
                except (IndexError, RuntimeError):
                    return None
                self.manual_backward(loss)
                return loss


        def average(shards):
            for shard in shards:
                try:
                    value = torch.load(shard)
                except OSError:
                    continue
                dist.all_reduce(value)
        """,
    )
    assert ("rank-exception", 13, "warning") in found
    assert ("rank-exception", 23, "warning") in found


def test_what_a_library_reduction_returns_is_agreed_and_its_argument_is_not(tmp_path: Path) -> None:
    """accelerate's reduce returns the sum on every rank: a test of what it returned decides
    alike; a test of what it was given (each rank's own flag) does not."""
    source = """
        import torch
        from accelerate import Accelerator


        def fit(model, loader):
            accelerator = Accelerator()
            for x in loader:
                loss = model(x).mean()
                bad = torch.tensor(float(not torch.isfinite(loss)))
                total = accelerator.reduce(bad, reduction="sum")
                if {tested}.item() > 0:
                    continue
                accelerator.backward(loss)
    """
    assert lint_source(tmp_path, source.format(tested="total")) == []
    assert [cause for cause, _, _ in lint_source(tmp_path, source.format(tested="bad"))] == [
        "data-dependent-branch"
    ]


def test_a_set_handed_to_a_helper_that_reduces_per_item_is_an_order_mismatch(tmp_path: Path) -> None:
    """`evaluate(confusion, heads)` with `heads = set(HEADS) - frozen`, and evaluate()
    all-reduces one tensor per item of its parameter: the set's order is the process's own
    (string hashing), so the ranks pair other heads. The same helper given `sorted(heads)`
    is clean."""
    script = tmp_path / "multihead.py"
    script.write_text(
        "import torch\n"
        "import torch.distributed as dist\n"
        "HEADS = {'pos': 17, 'ner': 9, 'chunk': 23}\n"
        "def evaluate(confusion, names):\n"
        "    for name in names:\n"
        "        dist.all_reduce(confusion[name])\n"
        "def main(frozen):\n"
        "    dist.init_process_group('gloo')\n"
        "    heads = set(HEADS) - set(frozen)\n"
        "    confusion = {h: torch.zeros(n, n) for h, n in HEADS.items()}\n"
        "    evaluate(confusion, heads)\n"
    )
    findings, _ = run_lint([script])
    (finding,) = [f for f in findings if f.cause == "collective-order-mismatch"]
    assert "which gets heads: a set" in finding.message, finding.message
    script.write_text(
        script.read_text().replace("evaluate(confusion, heads)", "evaluate(confusion, sorted(heads))")
    )
    findings, _ = run_lint([script])
    assert not [f for f in findings if f.cause == "collective-order-mismatch"], findings


def test_a_flag_a_callback_in_another_module_sets_from_the_metrics_it_is_handed_is_a_decision(
    tmp_path: Path,
) -> None:
    # callbacks.py sets `trainer.stop = True` when the metrics the trainer hands it say so;
    # train.py computes them on its own shard and reads only the flag. The twin (its own
    # folder, its own copy of the callback) all-reduces the loss first and stays clean,
    # though linted in the same run: a hook of the same name in another program is not
    # called by this one's trainer.
    callbacks = """
        class StopOnPlateau:
            def __init__(self):
                self.best = None
                self.waited = 0

            def after_eval(self, trainer, scores):
                if self.best is None or scores["loss"] < self.best:
                    self.best, self.waited = scores["loss"], 0
                else:
                    self.waited += 1
                if self.waited > 2:
                    trainer.stop = True
    """
    trainer = """
        import torch
        import torch.distributed as dist
        from callbacks import StopOnPlateau

        def run(model, batches, held_out):
            stopper = StopOnPlateau()

            class State:
                stop = False

            state = State()
            for epoch in range(100):
                for x in batches:
                    model(x).sum().backward()
                    dist.all_reduce(model.weight.grad)
                loss = sum(model(x).sum() for x in held_out){sync}
                stopper.after_eval(state, {{"loss": loss.item()}})
                if state.stop:
                    break
    """
    for folder, sync in (("local", ""), ("synced", "\n                dist.all_reduce(loss)")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "callbacks.py").write_text(textwrap.dedent(callbacks))
        (tmp_path / folder / "train.py").write_text(textwrap.dedent(trainer.format(sync=sync)))
    findings, _ = run_lint([tmp_path / "local", tmp_path / "synced"])
    flagged = [(Path(f.location.path).parent.name, f.cause) for f in findings]
    assert flagged == [("local", "unsynchronized-decision")], findings
    assert "`stop` is set at" in findings[0].message, findings[0].message
    assert "callbacks.py:13 in StopOnPlateau.after_eval() under `self.waited > 2`" in findings[0].message


def test_a_flag_bound_to_what_a_broadcasting_helper_returns_is_every_ranks(tmp_path: Path) -> None:
    # `stop = share(stop or (is_main and os.path.exists(path)))`: rank 0's file check goes in,
    # the broadcast value comes out; the `break` under it is taken by every rank alike
    source = """
        import os
        import torch
        import torch.distributed as dist

        def share(flag):
            t = torch.tensor([1 if flag else 0])
            dist.broadcast(t, src=0)
            return bool(t.item())

        def train(model, batches, patience):
            is_main = dist.get_rank() == 0
            bad = 0
            for epoch in range(100):
                for x in batches:
                    model(x).sum().backward()
                    dist.all_reduce(model.weight.grad)
                stop = bad >= patience
                stop = share(stop or (is_main and os.path.exists("STOP")))
                if stop:
                    break
    """
    assert lint_source(tmp_path, source) == []
    shared = 'stop = share(stop or (is_main and os.path.exists("STOP")))'
    unshared = source.replace(shared, "stop = stop or is_main")
    assert [cause for cause, _, _ in lint_source(tmp_path, unshared)] == ["rank-early-exit"]
