"""What the warm server imports for a first run: torch._dynamo only where the script's
source names what imports it (launch/replay.py, uses_torch_dynamo)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ncclcheck.launch.replay import uses_torch_dynamo


@pytest.mark.parametrize(
    "source",
    [
        "from torch.nn.parallel import DistributedDataParallel as DDP\nmodel = DDP(net)\n",
        "import torch.nn.parallel as par\nmodel = par.DistributedDataParallel(net)\n",
        "from torch.distributed.fsdp import fully_shard\nfully_shard(net)\n",
        "model = torch.compile(net)\n",
        "from accelerate import Accelerator\n",
        "import lightning as L\n",
        "from transformers import Trainer\n",
    ],
)
def test_a_script_that_wraps_or_compiles_its_model_gets_dynamo(tmp_path: Path, source: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(source)
    assert uses_torch_dynamo([str(script)])


def test_a_script_of_plain_collectives_is_forked_without_it(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch.distributed as dist\ndist.all_reduce(t)\nmodel = net  # no wrapper\n")
    assert not uses_torch_dynamo([str(script)])


def test_a_local_module_that_wraps_the_model_counts(tmp_path: Path) -> None:
    script, helper = tmp_path / "train.py", tmp_path / "helpers.py"
    script.write_text("from helpers import wrap\nmodel = wrap(net)\n")
    helper.write_text(
        "from torch.nn.parallel import DistributedDataParallel\n"
        "def wrap(m):\n    return DistributedDataParallel(m)\n"
    )
    assert uses_torch_dynamo([str(script), str(helper)])


def test_an_unreadable_file_is_taken_to_need_it(tmp_path: Path) -> None:
    assert uses_torch_dynamo([str(tmp_path / "gone.py")])
