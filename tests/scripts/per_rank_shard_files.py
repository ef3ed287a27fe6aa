"""Each rank trains on its own share of the shard files (files[rank::world_size]),
loaded without a DistributedSampler; the files hold different numbers of records, so
rank 0 has 10 batches and rank 1 6. After its last step rank 1 evaluates and waits in
the all_gather of the scores while rank 0 waits in its seventh step's gradient
all-reduce."""

import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import ConcatDataset, DataLoader, TensorDataset

RECORDS_PER_FILE = [24, 12, 16, 12]


def write_shards(directory: Path) -> list[Path]:
    generator = torch.Generator().manual_seed(0)
    files = []
    for index, records in enumerate(RECORDS_PER_FILE):
        path = directory / f"shard-{index}.pt"
        torch.save((torch.randn(records, 8, generator=generator), torch.randint(0, 2, (records,))), path)
        files.append(path)
    return files


def load(files: list[Path]) -> ConcatDataset:
    return ConcatDataset([TensorDataset(*torch.load(path)) for path in files])


def evaluate(model: nn.Module, loader: DataLoader) -> list[torch.Tensor]:
    model.eval()
    with torch.no_grad():
        correct = sum(int((model(x).argmax(1) == y).sum()) for x, y in loader)
    scores = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(scores, torch.tensor([float(correct)]))
    return scores


def main() -> None:
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    directory = Path(tempfile.mkdtemp(prefix=f"shards-{rank}-"))
    files = write_shards(directory)
    train_set = load(files[rank::world_size])
    train_loader = DataLoader(train_set, batch_size=4, shuffle=True)
    model = DDP(nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    for features, labels in train_loader:
        optimizer.zero_grad()
        F.cross_entropy(model(features), labels).backward()
        optimizer.step()
    scores = evaluate(model, train_loader)
    if rank == 0:
        print("correct per rank", [int(s) for s in scores], flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
