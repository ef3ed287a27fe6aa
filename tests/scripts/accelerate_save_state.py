"""A checkpoint saved on the main process alone (huggingface/accelerate#1171): with
automatic checkpoint naming, accelerate's save_state() waits for every process
before it writes, so the main process waits there while the others wait in the
wait_for_everyone() after the block.

MODE=auto (the default) names checkpoints automatically; MODE=explicit gives
save_state() a folder, and under plain DDP it then makes no collective at all.
CKPT_DIR: where to save (default: a new temporary folder).
"""

import os
import tempfile

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    automatic = os.environ.get("MODE", "auto") == "auto"
    folder = os.environ.get("CKPT_DIR") or tempfile.mkdtemp(prefix="ckpt-")
    config = ProjectConfiguration(project_dir=folder, automatic_checkpoint_naming=automatic)
    accelerator = Accelerator(cpu=True, project_config=config)
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    loader = DataLoader(data, batch_size=8)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(2):
        for features, labels in loader:
            optimizer.zero_grad()
            accelerator.backward(F.cross_entropy(model(features), labels))
            optimizer.step()
        if accelerator.is_main_process:
            accelerator.save_state(None if automatic else os.path.join(folder, f"epoch-{epoch}"))
        accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
