"""preflight and doctor on scripts built with accelerate, PyTorch Lightning, the
transformers Trainer and torchmetrics (examples/frameworks): real ranks, gloo on CPU.

Each framework has an aligned script and a misaligned one; the finding must point
at the user's line, never at the framework's code. The frameworks are in the test
extra; a test whose framework is not installed is skipped and says which.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from ..conftest import FRAMEWORKS, REPO, aligned_but_for_decisions, line_in
from .test_doctor import doctor_on_hung
from .test_preflight import leftover_ranks, preflight

pytestmark = [pytest.mark.ranks, pytest.mark.warm_start]  # preflight forks its ranks warm (conftest)


@dataclass(frozen=True)
class Framework:
    name: str  # as the playbook's fix.frameworks and the finding's evidence say it
    module: str  # what must be importable
    site: str  # a fragment of the misaligned script's line the finding must name
    guard: str  # the rank test that sends rank 0 there

    def script(self, kind: str) -> Path:
        return FRAMEWORKS / f"{self.name}_{kind}.py"

    def site_text(self) -> str:
        script = self.script("misaligned")
        return f"{script.relative_to(REPO)}:{line_in(script, self.site)}"

    def require(self) -> None:
        if importlib.util.find_spec(self.module) is None:
            pytest.skip(f"{self.module} is not installed (pip install -e '.[test]' installs it)")


FRAMEWORK_CASES = [
    Framework("accelerate", "accelerate", "accelerator.gather(", "accelerator.is_main_process"),
    Framework(
        "lightning", "lightning", 'self.log("val_loss", loss, sync_dist=True)', "self.trainer.is_global_zero"
    ),
    Framework(
        "transformers",
        "transformers",
        "dist.all_reduce(loss, op=dist.ReduceOp.MIN)",
        "state.is_world_process_zero",
    ),
    Framework("torchmetrics", "torchmetrics", "accuracy.compute()", "dist.get_rank() == 0"),
]
IDS = [f.name for f in FRAMEWORK_CASES]
LIGHTNING = FRAMEWORK_CASES[1]


@pytest.mark.parametrize("framework", FRAMEWORK_CASES, ids=IDS)
def test_aligned_script_is_aligned(framework: Framework) -> None:
    framework.require()
    proc, report = preflight("--nproc-per-node=2", str(framework.script("aligned")))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["verdict"] == "aligned", json.dumps(report["findings"], indent=1)
    assert all(rank["eval_batches"] for rank in report["ranks"]), report["ranks"]
    # the framework shards its loaders itself: no missing-sampler warning
    assert not report["findings"], report["findings"]
    assert not leftover_ranks(str(framework.script("aligned")))


@pytest.mark.parametrize("framework", FRAMEWORK_CASES, ids=IDS)
def test_misaligned_script_is_found_at_the_users_line(framework: Framework) -> None:
    framework.require()
    script = framework.script("misaligned")
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 1, proc.stderr[-3000:]
    finding = report["findings"][0]
    assert finding["cause"] == "rank-conditional-collective", json.dumps(finding, indent=1)
    assert finding["site"] == framework.site_text(), finding
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])
    assert any(f"`if {framework.guard}`" in line for line in finding["evidence"]), finding["evidence"]
    # the playbook's fix in the framework's own terms
    assert any(line.startswith(f"with {framework.name}: ") for line in finding["evidence"]), finding
    if framework.name == "torchmetrics":  # its barrier, named for the compute() that issued it
        assert (
            "barrier (torchmetrics' gather of every rank's metric state, in compute())" in finding["message"]
        )
    assert not leftover_ranks(str(script))


def test_lightning_sync_dist_is_sited_at_self_log_and_the_budget_is_lightnings() -> None:
    """Lightning reduces a sync_dist value at the end of the epoch, deep inside
    trainer.fit: the finding still names the self.log line, says when it ran, and
    the dry run shortened the epoch through Lightning's own limit_train_batches."""
    pytest.importorskip("lightning", reason="lightning is not installed")
    proc, report = preflight("--nproc-per-node=2", str(FRAMEWORKS / "lightning_misaligned.py"))
    assert proc.returncode == 1, proc.stderr[-3000:]
    evidence = report["findings"][0]["evidence"]
    assert any(
        "Lightning ran it later for self.log('val_loss', sync_dist=True), inside main()" in line
        for line in evidence
    ), evidence
    chain = next(line for line in evidence if line.startswith("call chain on rank 0"))
    assert chain.endswith(f"validation_step() at {LIGHTNING.site_text()}"), chain
    assert report["summary"]["framework"] == [
        f"Lightning Trainer limit_train_batches=5 (was 1.0) at "
        f"{(FRAMEWORKS / 'lightning_misaligned.py').relative_to(REPO)}:"
        f"{line_in(FRAMEWORKS / 'lightning_misaligned.py', 'trainer = pl.Trainer(')} (ranks 0-1)"
    ]


def test_lightning_dry_run_validates_after_short_epochs_and_stops(tmp_path: Path) -> None:
    """A 100-epoch Lightning run ends after the sanity check, one real validation and
    the budget's train steps after it, not after 100 epochs."""
    pytest.importorskip("lightning", reason="lightning is not installed")
    script = tmp_path / "long_fit.py"
    source = (FRAMEWORKS / "lightning_aligned.py").read_text()
    script.write_text(source.replace("max_epochs=2", "max_epochs=100"))
    proc, report = preflight("--nproc-per-node=2", "--train-steps=3", str(script))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["verdict"] == "aligned"
    assert (
        report["summary"]["stopped"]
        == "stopped after 1 complete eval pass(es) and 3 train steps after the last"
    )
    # sanity check (2 batches) + one validation (2 batches per rank)
    assert [r["eval_batches"] for r in report["ranks"]] == [4, 4]


@pytest.mark.parametrize("framework", FRAMEWORK_CASES, ids=IDS)
def test_doctor_on_a_hung_framework_job_names_the_users_line(framework: Framework) -> None:
    framework.require()
    code, report = doctor_on_hung(framework.script("misaligned"), 2)
    assert code == 1, json.dumps({k: report.get(k) for k in ("verdict", "summary", "findings")}, indent=1)
    finding = report["findings"][0]
    assert finding["cause"] == "rank-conditional-collective", json.dumps(finding, indent=1)
    assert finding["site"] == framework.site_text(), finding
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])
    assert any(line.startswith(f"with {framework.name}: ") for line in finding["evidence"]), finding
    assert not leftover_ranks(str(framework.script("misaligned")))


def test_doctor_on_a_job_started_by_accelerate_launch_with_a_config() -> None:
    """accelerate launch --config_file runs torchrun's agent inside its own process: the
    ranks are found from it, by the RANK it gives them."""
    framework = FRAMEWORK_CASES[0]
    framework.require()
    config = REPO / "tests" / "scripts" / "accelerate_config_multi_gpu.yaml"
    code, report = doctor_on_hung(framework.script("misaligned"), 2, accelerate_config=config)
    assert code == 1, report
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    finding = report["findings"][0]
    assert finding["cause"] == "rank-conditional-collective", json.dumps(finding, indent=1)
    assert finding["site"] == framework.site_text(), finding
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])
    assert not leftover_ranks(str(framework.script("misaligned")))


def test_lightning_ddp_spawn_is_run_once_and_its_spawned_ranks_recorded(tmp_path: Path) -> None:
    """strategy="ddp_spawn": Lightning starts the ranks itself (torch.multiprocessing's
    start_processes, inside Lightning): found when the torchrun rank refuses to start
    more, and the script is run again, once, with every rank it starts recorded."""
    LIGHTNING.require()
    source = LIGHTNING.script("misaligned").read_text()
    assert 'strategy="ddp",' in source
    script = tmp_path / "lightning_ddp_spawn.py"
    script.write_text(source.replace('strategy="ddp",', 'strategy="ddp_spawn",'))
    proc, report = preflight(str(script))
    assert proc.returncode == 1, proc.stderr[-3000:]
    finding = report["findings"][0]
    assert finding["cause"] == "rank-conditional-collective", json.dumps(finding, indent=1)
    assert finding["site"].endswith(f"lightning_ddp_spawn.py:{line_in(script, LIGHTNING.site)}"), finding
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])
    assert report["summary"]["launcher"].startswith("the script starts its own ranks (torch.multiprocessing")
    assert not leftover_ranks(str(script))


def edited_example(example: str, folder: Path, line: str, instead: str) -> Path:
    """A copy of a transformers example with one setting changed (the line must be there)."""
    pytest.importorskip("transformers", reason="transformers is not installed")
    source = (FRAMEWORKS / example).read_text()
    assert line in source
    script = folder / example
    script.write_text(source.replace(line, instead))
    return script


def test_transformers_evaluation_every_n_steps_is_brought_within_the_budget(tmp_path: Path) -> None:
    """eval_strategy="steps" with eval_steps=50: a 5-step dry run would never evaluate
    and would call the job aligned; the Trainer is given eval_steps=5 instead."""
    script = edited_example(
        "transformers_misaligned.py",
        tmp_path,
        'eval_strategy="epoch",',
        'eval_strategy="steps", eval_steps=50,',
    )
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert report["findings"][0]["cause"] == "rank-conditional-collective"
    (changed,) = report["summary"]["framework"]
    assert changed.startswith("transformers Trainer eval_steps=5 (was 50) at "), changed


def test_transformers_evaluation_of_a_large_set_is_fast_forwarded(tmp_path: Path) -> None:
    """The Trainer's eval loader is named and marked eval by get_eval_dataloader, so the
    agreement applies as its evaluation loop starts: 992 of 1,000 batches skipped."""
    script = edited_example(
        "transformers_aligned.py",
        tmp_path,
        "eval_dataset=Sentences(32, 1),",
        "eval_dataset=Sentences(16000, 1),",
    )
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["verdict"] == "aligned", report["findings"]
    assert report["summary"]["eval_batches"] == {"0": 1000, "1": 1000}
    assert report["summary"]["eval_fast_forward"] == [
        "eval_dataloader: the first 992 of 1000 batches skipped on every rank (not loaded), "
        "the rest run for real"
    ]


LOG_DICT_KEYS = REPO / "tests" / "scripts" / "lightning_log_dict_keys.py"


def test_lightning_log_dict_with_per_rank_names_is_found_though_it_never_hangs() -> None:
    """Same number of names, different names per rank: the reductions pair silently and
    average one name's value with another's. By site and op the runs agree; what the
    framework reduces does not."""
    pytest.importorskip("lightning", reason="lightning is not installed")
    proc, report = preflight("--nproc-per-node=2", str(LOG_DICT_KEYS), env={"MODE": "swapped"})
    assert proc.returncode == 1, proc.stderr[-3000:]
    finding = report["findings"][0]
    assert finding["cause"] == "collective-shape-mismatch", json.dumps(finding, indent=1)
    assert (
        finding["site"]
        == f"tests/scripts/lightning_log_dict_keys.py:{line_in(LOG_DICT_KEYS, 'self.log_dict(metrics')}"
    )
    assert (finding["ranks"], finding["absent_ranks"]) == ([0, 1], [])
    assert (
        "rank 0: self.log('val_loss_neg', sync_dist=True); rank 1: self.log('val_loss_pos', sync_dist=True)"
        in finding["message"]
    )
    assert any(
        line.startswith("with lightning: Log the same names on every rank") for line in finding["evidence"]
    )


def test_lightning_log_dict_with_a_name_only_one_rank_logs_names_that_reduction() -> None:
    pytest.importorskip("lightning", reason="lightning is not installed")
    proc, report = preflight("--nproc-per-node=2", str(LOG_DICT_KEYS), env={"MODE": "extra"})
    assert proc.returncode == 1, proc.stderr[-3000:]
    finding = report["findings"][0]
    assert (finding["ranks"], finding["absent_ranks"]) == ([1], [0]), finding
    assert (
        "rank 1: Lightning reduces self.log('val_loss_pos_only', sync_dist=True) here; "
        "rank 0: no such reduction at this point" in "\n".join(finding["evidence"])
    )


SKIP_PADDING = REPO / "tests" / "scripts" / "lightning_skip_padding_batch.py"


@pytest.mark.parametrize("mode", ["broken", "fixed"])
def test_a_lightning_step_returning_none_on_one_ranks_batch_is_named_at_its_test(mode: str) -> None:
    """The rank dies of Lightning's refusal; what sent it there is the test on its own batch,
    watched in the run: that test is the site, with the error as evidence."""
    pytest.importorskip("lightning", reason="lightning is not installed")
    proc, report = preflight("--nproc-per-node=2", str(SKIP_PADDING), env={"MODE": mode})
    if mode == "fixed":
        aligned_but_for_decisions(proc.returncode, report)
        return
    assert proc.returncode == 1, proc.stderr[-3000:]
    finding = report["findings"][0]
    assert finding["cause"] == "data-dependent-branch", json.dumps(finding, indent=1)
    test_line = line_in(SKIP_PADDING, "if mask.sum() == 0")
    assert finding["site"] == f"tests/scripts/lightning_skip_padding_batch.py:{test_line}"
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1]), finding
    assert "rank 1 took `if mask.sum() == 0`" in finding["message"], finding["message"]
    said = "\n".join(finding["evidence"])
    assert "Skipping the `training_step` by returning None" in said, said
    assert "Lightning's backward of the loss training_step returns" in said, said


def test_accelerate_save_state_on_the_main_process_alone_is_found_by_what_it_waits_in(tmp_path: Path) -> None:
    FRAMEWORK_CASES[0].require()
    script = REPO / "tests" / "scripts" / "accelerate_save_state.py"
    proc, report = preflight("--nproc-per-node=2", str(script), env={"CKPT_DIR": str(tmp_path / "auto")})
    assert proc.returncode == 1, proc.stderr[-3000:]
    finding = report["findings"][0]
    assert finding["cause"] == "rank-conditional-collective", json.dumps(finding, indent=1)
    assert (
        finding["site"]
        == f"tests/scripts/accelerate_save_state.py:{line_in(script, 'accelerator.save_state(')}"
    )
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])
    assert "only rank 0 reached barrier (accelerate's wait_for_everyone)" in finding["message"]
    assert any("inside save_state() with automatic checkpoint naming" in line for line in finding["evidence"])

    # given a folder, save_state makes no collective under plain DDP: nothing to find
    proc, report = preflight(
        "--nproc-per-node=2", str(script), env={"MODE": "explicit", "CKPT_DIR": str(tmp_path / "explicit")}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["verdict"] == "aligned", report["findings"]
    assert not leftover_ranks(str(script))


def test_lightning_save_checkpoint_on_global_zero_alone_is_named_with_lightnings_fix() -> None:
    LIGHTNING.require()
    script = REPO / "tests" / "scripts" / "lightning_save_checkpoint.py"
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 1, proc.stderr[-3000:]
    finding = report["findings"][0]
    assert finding["cause"] == "rank-conditional-collective", json.dumps(finding, indent=1)
    site = line_in(script, "trainer.save_checkpoint(path)  # global zero alone")
    assert finding["site"] == f"tests/scripts/lightning_save_checkpoint.py:{site}"
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])
    assert "only rank 0 reached barrier (Lightning's strategy barrier)" in finding["message"]
    assert "under `if trainer.is_global_zero`" in finding["message"]
    evidence = "\n".join(finding["evidence"])
    assert "trainer.save_checkpoint() waits for every rank" in evidence
    assert "self.log" not in evidence  # the playbook's Lightning fix is about another API

    proc, report = preflight("--nproc-per-node=2", str(script), env={"MODE": "everyone"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["verdict"] == "aligned", report["findings"]
    assert not leftover_ranks(str(script))


LARGE_VAL = REPO / "tests" / "scripts" / "lightning_large_val.py"


def test_lightning_validation_is_fast_forwarded_under_its_own_loop() -> None:
    """Lightning makes its eval loop's iterator before model.eval(): the pass is still an
    eval pass as it starts, so --eval-batches' agreement applies under Lightning's loop
    (its limit_val_batches is left alone: it would cut every rank at its first batches).
    The sanity check's two batches count as drawn, not as their positions."""
    pytest.importorskip("lightning", reason="lightning is not installed")
    proc, report = preflight("--nproc-per-node=2", str(LARGE_VAL))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["verdict"] == "aligned", report["findings"]
    assert report["summary"]["eval_fast_forward"] == [
        "loader#0: the first 2492 of 2500 batches skipped on every rank (not loaded), the rest run for real"
    ]
    assert report["summary"]["eval_batches"] == {"0": 2 + 2500, "1": 2 + 2500}


def test_lightning_hand_split_validation_is_an_uneven_end_not_a_logging_mismatch() -> None:
    """use_distributed_sampler=False and a hand split of 20,001 samples: rank 0's extra
    step reduces its on_step log while rank 1 reduces the epoch's value: one name, one
    batch more on rank 0 (before, "values logged under different names")."""
    pytest.importorskip("lightning", reason="lightning is not installed")
    proc, report = preflight(
        "--nproc-per-node=2", str(LARGE_VAL), env={"HAND_SPLIT": "1", "VAL_SAMPLES": "20001"}
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert (finding["cause"], finding["ranks"], finding["absent_ranks"]) == ("uneven-eval-batches", [0], [1])
    assert finding["site"] == f"tests/scripts/lightning_large_val.py:{line_in(LARGE_VAL, 'self.log(')}"
    assert (
        "lengths the ranks' loaders had as the pass over loader#0 began, before any batch: "
        "rank 0: 2501, rank 1: 2500"
    ) in finding["evidence"]
