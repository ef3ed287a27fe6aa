"""A class trainer whose early-stopping callback sets ``trainer.should_stop`` when its
patience runs out on the validation loss the trainer hands it, each rank's own (validate()
sums its shard's losses and all-reduces nothing). The trainer only reads the flag: the line
that decides is the callback's. Within a dry run's budget patience never runs out; in a real
run it does on one rank first, which leaves the epoch loop while the others wait in the next
epoch's gradient all-reduce. Fixed twin: callback_stops_the_trainer_on_the_mean.py."""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class EarlyStopping:
    def __init__(self, patience: int = 3) -> None:
        self.patience = patience
        self.best = float("inf")
        self.bad_epochs = 0

    def on_validation_end(self, trainer: "Trainer", metrics: dict[str, float]) -> None:
        if metrics["val_loss"] < self.best:
            self.best = metrics["val_loss"]
            self.bad_epochs = 0
        else:
            self.bad_epochs += 1
            if self.bad_epochs >= self.patience:
                trainer.should_stop = True


class Trainer:
    def __init__(self, model: nn.Module, train: DataLoader, val: DataLoader, callbacks: list) -> None:
        self.model = model
        self.train_loader = train
        self.val_loader = val
        self.callbacks = callbacks
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        self.should_stop = False

    def validate(self) -> dict[str, float]:
        total, count = 0.0, 0
        with torch.no_grad():
            for x, y in self.val_loader:
                total += nn.functional.mse_loss(self.model(x), y, reduction="sum").item()
                count += len(x)
        return {"val_loss": total / max(count, 1)}

    def fit(self, epochs: int) -> None:
        for _ in range(epochs):
            for x, y in self.train_loader:
                self.optimizer.zero_grad()
                nn.functional.mse_loss(self.model(x), y).backward()
                self.optimizer.step()
            metrics = self.validate()
            for callback in self.callbacks:
                callback.on_validation_end(self, metrics)
            if self.should_stop:
                break


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    x = torch.randn(128, 8)
    train = TensorDataset(x, x.sum(1, keepdim=True))
    val = TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
    trainer = Trainer(
        DDP(nn.Linear(8, 1)),
        DataLoader(train, batch_size=16, sampler=DistributedSampler(train)),
        DataLoader(val, batch_size=16, sampler=DistributedSampler(val, shuffle=False)),
        [EarlyStopping()],
    )
    trainer.fit(epochs=3)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
