"""A best-checkpoint callback that runs on the main process only and, where the epoch's
logs hold no validation loss (every 25th epoch skips validation), evaluates to get one:
the evaluation all-reduces, on rank 0 alone. Within a dry run every epoch validates, so
that path never runs: the source decides it. Its fixed twin (the test writes it)
evaluates on every rank before the main-only bookkeeping."""

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self) -> None:
        self.is_main = dist.get_rank() == 0
        self.weight = torch.zeros(3)

    def evaluate(self) -> dict[str, float]:
        total = torch.tensor([float(dist.get_rank() + 1), 1.0])
        dist.all_reduce(total)
        return {"val_loss": float(total[0] / total[1])}


class BestCheckpoint:
    def __init__(self) -> None:
        self.best = float("inf")

    def on_epoch_end(self, trainer: Trainer, logs: dict[str, float]) -> None:
        if trainer.is_main:
            current = logs.get("val_loss")
            if current is None:
                current = trainer.evaluate()["val_loss"]
            self.best = min(self.best, current)


def main() -> None:
    dist.init_process_group("gloo")
    trainer, callback = Trainer(), BestCheckpoint()
    loader = DataLoader(TensorDataset(torch.ones(64, 3)), batch_size=8)
    for epoch in range(10):
        for (batch,) in loader:
            step = batch.sum(0)
            dist.all_reduce(step)
        logs: dict[str, float] = {}
        if epoch % 25 != 24:
            logs.update(trainer.evaluate())
        callback.on_epoch_end(trainer, logs)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
