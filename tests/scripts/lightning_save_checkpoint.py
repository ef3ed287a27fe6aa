"""Lightning: trainer.save_checkpoint() waits for every rank (a strategy barrier inside)
and writes the file on global zero alone.

MODE=global_zero (the default): a callback saves on global zero only: rank 0 waits in
the barrier, the others go on with Lightning's own.
MODE=everyone: every rank calls it: aligned.
"""

import os
import tempfile

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

MODE = os.environ.get("MODE", "global_zero")


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
        (x,) = batch
        return self.net(x).pow(2).mean()

    def validation_step(self, batch: list[torch.Tensor], index: int) -> None:
        (x,) = batch
        self.log("val_loss", self.net(x).pow(2).mean(), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class SaveAfterValidation(L.Callback):
    def on_validation_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        path = os.path.join(tempfile.gettempdir(), f"ncclcheck-test-{os.getpid()}.ckpt")
        if MODE == "everyone":
            trainer.save_checkpoint(path)
        elif trainer.is_global_zero:
            trainer.save_checkpoint(path)  # global zero alone


def main() -> None:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=2,
        callbacks=[SaveAfterValidation()],
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(Regressor(), DataLoader(data, batch_size=8), DataLoader(data, batch_size=8))


if __name__ == "__main__":
    main()
