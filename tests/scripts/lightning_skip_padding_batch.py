"""PyTorch Lightning: a training_step that skips a batch with no real tokens by returning
None. Lightning documents that skip, and refuses it under DDP: the rank whose batch is all
padding raises ("Skipping the training_step by returning None in distributed training
is not supported") while the other waits in the gradient all-reduce of its step.

The train set is dealt by hand (DistributedSampler without shuffling): rank 1's second
batch, indices 9, 11, 13 and 15, is all padding. MODE=fixed keeps the step on every
rank and zeroes the loss of such a batch instead."""

import os

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

PADDED = (9, 11, 13, 15)


class Tagger(pl.LightningModule):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.net = nn.Linear(8, 3)

    def training_step(self, batch, batch_idx):
        tokens, labels, mask = batch
        if mask.sum() == 0:
            if self.mode == "fixed":
                # every rank still runs backward: a zero loss keeps DDP's all-reduce in step
                return self.net(tokens).sum() * 0.0
            return None
        logits = self.net(tokens)
        loss = F.cross_entropy(logits[mask], labels[mask])
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        tokens = torch.randn(64, 8, generator=generator)
        labels = torch.randint(0, 3, (64,), generator=generator)
        mask = torch.ones(64, dtype=torch.bool)
        mask[list(PADDED)] = False
        data = TensorDataset(tokens, labels, mask)
        return DataLoader(data, batch_size=4, sampler=DistributedSampler(data, shuffle=False))


def main() -> None:
    torch.manual_seed(0)
    trainer = pl.Trainer(
        accelerator="cpu",
        strategy="ddp",
        devices=2,
        max_epochs=1,
        use_distributed_sampler=False,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Tagger(os.environ.get("MODE", "broken")))


if __name__ == "__main__":
    main()
