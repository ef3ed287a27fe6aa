"""PyTorch Lightning with a large validation set (VAL_SAMPLES, 20,000 by default) and a
loss logged with sync_dist=True on every step: preflight runs its last --eval-batches
batches under Lightning's own loop. HAND_SPLIT=1 shards the set by hand (with
use_distributed_sampler=False, as scripts that shard their own data set it), the
remainder to rank 0: rank 0's last step reduces alone."""

import os

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Subset, TensorDataset


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        features, targets = batch
        return F.mse_loss(self.net(features).squeeze(-1), targets)

    def validation_step(self, batch, batch_idx):
        features, targets = batch
        loss = F.mse_loss(self.net(features).squeeze(-1), targets)
        self.log("val_loss", loss, on_step=True, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    samples = int(os.environ.get("VAL_SAMPLES", "20000"))
    hand_split = os.environ.get("HAND_SPLIT") == "1"
    trainer = pl.Trainer(
        accelerator="cpu",
        strategy="ddp",
        devices=2,
        max_epochs=1,
        use_distributed_sampler=not hand_split,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    train = TensorDataset(torch.randn(64, 8), torch.randn(64))
    val = TensorDataset(torch.randn(samples, 8), torch.randn(samples))
    if hand_split:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        per_rank = samples // world
        extra = samples % world if rank == 0 else 0
        val = Subset(val, range(rank * per_rank, (rank + 1) * per_rank + extra))
    trainer.fit(Regressor(), DataLoader(train, batch_size=8), DataLoader(val, batch_size=4))


if __name__ == "__main__":
    main()
