"""Buffers synchronised by name, the names a property gives as a set: float buffers
all-reduced, counters broadcast. Each process iterates a set of strings in the order of
their hashes, so where one rank meets a float buffer the other meets a counter: one waits
in all_reduce, the other in broadcast. Its fixed twin (the test writes it) returns them
sorted."""

import torch
import torch.distributed as dist
from torch import nn


class Stats(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))
        for name in "abcde":
            self.register_buffer(f"mean_{name}", torch.zeros(4))
            self.register_buffer(f"seen_{name}", torch.zeros((), dtype=torch.long))


class BufferSync:
    def __init__(self, module: nn.Module) -> None:
        self.module = module

    @property
    def buffer_names(self):  # type: ignore[no-untyped-def]
        return set(self.module.state_dict()) - {n for n, _ in self.module.named_parameters()}

    def __call__(self) -> None:
        state = self.module.state_dict()
        for name in self.buffer_names:
            tensor = state[name]
            if tensor.is_floating_point():
                dist.all_reduce(tensor)
            else:
                dist.broadcast(tensor, src=0)


def main() -> None:
    dist.init_process_group("gloo")
    sync = BufferSync(Stats())
    for _ in range(2):
        sync()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
