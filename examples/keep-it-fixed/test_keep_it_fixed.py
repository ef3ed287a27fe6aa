"""The CI layer of "Keep it fixed" (README): the uneven-eval-batches playbook under the
pytest plugin. `pytest examples/keep-it-fixed` runs both tests; add --runxfail to see
the report the misaligned one fails with.
"""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Subset
from torch.utils.data.distributed import DistributedSampler

from ncclcheck.pytest_plugin import assert_aligned

PLAYBOOK = Path(__file__).resolve().parents[2] / "playbooks" / "uneven-eval-batches"
repro = runpy.run_path(str(PLAYBOOK / "repro.py"))  # validate() and the synthetic data


def test_the_fixed_training_script_stays_aligned() -> None:
    # preflight on the whole script: train and eval loops, 4 ranks, 49 validation samples
    assert_aligned(PLAYBOOK / "fixed.py", nproc=4)


@pytest.mark.xfail(reason="hand-made shards: rank 0 has one eval batch more", strict=True)
@pytest.mark.ncclcheck(nproc=4)
def test_validate_on_hand_made_shards(rank: int, world_size: int) -> None:
    val_set = repro["synthetic_dataset"](49, seed=1)
    loader = DataLoader(Subset(val_set, range(rank, len(val_set), world_size)), batch_size=4)
    repro["validate"](nn.Linear(16, 2), loader)


@pytest.mark.ncclcheck(nproc=4)
def test_validate_on_distributed_sampler_shards(world_size: int) -> None:
    val_set = repro["synthetic_dataset"](49, seed=1)
    loader = DataLoader(val_set, batch_size=4, sampler=DistributedSampler(val_set, shuffle=False))
    assert len(loader) == 4  # padded: 52 samples over 4 ranks
    assert torch.isfinite(torch.tensor(repro["validate"](nn.Linear(16, 2), loader)))
