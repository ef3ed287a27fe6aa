"""PyTorch Lightning: self.log_dict(..., sync_dist=True) whose keys depend on the
batch (Lightning-AI/pytorch-lightning#19106). The validation shards split by label:
rank 0 sees only class 0, rank 1 only class 1.

MODE=swapped: each rank logs one name of its own ("val_loss_neg" / "val_loss_pos"):
Lightning reduces them name by name, so rank 0's value is averaged with rank 1's
other name, silently. MODE=extra: rank 1 alone also logs "val_loss_pos_only", a
reduction rank 0 never makes: the job hangs."""

import os

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(pl.LightningModule):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.net = nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        features, labels = batch
        return F.cross_entropy(self.net(features), labels)

    def validation_step(self, batch, batch_idx):
        features, labels = batch
        loss = F.cross_entropy(self.net(features), labels)
        metrics = {"val_loss": loss}
        positive = bool(labels.float().mean() > 0.5)
        if self.mode == "swapped":
            metrics["val_loss_pos" if positive else "val_loss_neg"] = loss
        elif positive:
            metrics["val_loss_pos_only"] = loss
        self.log_dict(metrics, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    torch.manual_seed(0)
    trainer = pl.Trainer(
        accelerator="cpu",
        strategy="ddp",
        devices=2,
        max_epochs=1,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    train = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    # Lightning's DistributedSampler deals index i to rank i % 2: labels by parity
    val = TensorDataset(torch.randn(32, 8), torch.arange(32) % 2)
    trainer.fit(
        Classifier(os.environ.get("MODE", "swapped")),
        DataLoader(train, batch_size=8),
        DataLoader(val, batch_size=8),
    )


if __name__ == "__main__":
    main()
