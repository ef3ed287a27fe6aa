"""PyTorch Lightning, fixed: every rank logs the validation loss with sync_dist=True,
so every rank takes part in Lightning's epoch-end reduction of it.

    ncclcheck preflight --nproc-per-node 2 examples/frameworks/lightning_aligned.py
"""

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def dataset(samples: int, seed: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(samples, 8, generator=gen)
    return TensorDataset(features, (features.sum(dim=1) > 0).long())


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        features, labels = batch
        loss = F.cross_entropy(self.net(features), labels)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        features, labels = batch
        loss = F.cross_entropy(self.net(features), labels)
        self.log("val_loss", loss, sync_dist=True)  # on every rank: Lightning reduces it

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    trainer = pl.Trainer(
        accelerator="cpu",
        strategy="ddp",
        devices=2,  # under torchrun, Lightning takes the ranks torchrun started
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    train = DataLoader(dataset(128, 0), batch_size=8)
    val = DataLoader(dataset(32, 1), batch_size=8)
    trainer.fit(Classifier(), train, val)


if __name__ == "__main__":
    main()
