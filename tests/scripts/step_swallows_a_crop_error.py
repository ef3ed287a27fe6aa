"""A class trainer whose step crops each batch of documents in a try and returns None
on an error, before backward (a Lightning-style manual step); the fit loop broadcasts
rank 0's stop flag at the top of every step. Rank 1's fourth batch holds a document
shorter than the crop: torch.randint raises, the step returns before backward, and
rank 1 waits in the next step's broadcast while rank 0 waits in the gradient
all-reduce."""

import logging

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

log = logging.getLogger("trainer")
CROP = 6


class Trainer:
    def __init__(self) -> None:
        self.model = DDP(nn.Linear(CROP, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def crop(self, document: torch.Tensor) -> torch.Tensor:
        start = int(torch.randint(0, len(document) - CROP + 1, (1,)))
        return document[start : start + CROP]

    def training_step(self, documents: list[torch.Tensor]) -> torch.Tensor | None:
        try:
            inputs = torch.stack([self.crop(document) for document in documents])
            loss = self.model(inputs).pow(2).mean()
        except RuntimeError as err:  # a document too short to crop
            log.warning("skipping a batch: %s", err)
            return None
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def fit(self, batches: list[list[torch.Tensor]]) -> None:
        stop = torch.zeros(1)
        for documents in batches:
            dist.broadcast(stop, src=0)  # rank 0 may ask every rank to stop
            if stop.item():
                break
            self.training_step(documents)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    generator = torch.Generator().manual_seed(rank)
    lengths = [[8 + int(torch.randint(0, 8, (1,), generator=generator)) for _ in range(2)] for _ in range(8)]
    if rank == 1:
        lengths[3][0] = 4  # one short document in this rank's share
    batches = [[torch.randn(n, generator=generator) for n in batch] for batch in lengths]
    Trainer().fit(batches)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
