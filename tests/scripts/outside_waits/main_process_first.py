"""accelerate's main_process_first: the main process builds the data set's cache while
the others wait in a barrier inside accelerate, then they read it. Correct while the
build stays under the process group's timeout. PREPARE_S: how long the build waits
on its source (default 40)."""

from __future__ import annotations

import os
import tempfile
import time

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

PREPARE_S = float(os.environ.get("PREPARE_S", "40"))


def cached_dataset(path: str) -> TensorDataset:
    if not os.path.exists(path):
        time.sleep(PREPARE_S)  # reading the raw files from a slow network share
        torch.save(torch.randn(64, 8), path)
    return TensorDataset(torch.load(path), torch.zeros(64))


def main() -> None:
    accelerator = Accelerator(cpu=True)
    cache = os.path.join(tempfile.gettempdir(), f"cache-{os.environ.get('TORCHELASTIC_RUN_ID', 'local')}.pt")
    with accelerator.main_process_first():
        dataset = cached_dataset(cache)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(dataset, batch_size=8)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch, _ in loader:
        optimizer.zero_grad()
        accelerator.backward(model(batch).sum())
        optimizer.step()
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        os.remove(cache)


if __name__ == "__main__":
    main()
