"""callback_stops_the_trainer.py fixed: validate() all-reduces its shard's loss sum and
sample count, so the callback is handed the same mean on every rank and its patience runs
out on all of them at once."""

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
        totals = torch.tensor([total, float(count)])
        dist.all_reduce(totals)
        return {"val_loss": (totals[0] / totals[1].clamp(min=1)).item()}

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
