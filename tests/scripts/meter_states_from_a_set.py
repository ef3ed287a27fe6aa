"""A meter whose state dict __init__ builds from a module-level set of metric names, summed
over ranks one all_reduce per state in sync(): each process meets the names in its own hash
order, so the n-th all_reduce pairs states of other sizes. MODE=fixed builds it sorted."""

import os

import torch
import torch.distributed as dist

STATE_NAMES = {f"state_{name}" for name in "abcdefghij"}
SIZES = {f"state_{name}": size for size, name in enumerate("abcdefghij", start=1)}


class Meter:
    def __init__(self) -> None:
        names = sorted(STATE_NAMES) if os.environ.get("MODE") == "fixed" else STATE_NAMES
        self.states = {name: torch.zeros(SIZES[name]) for name in names}

    def sync(self) -> None:
        for _name, state in self.states.items():
            dist.all_reduce(state)


def main() -> None:
    dist.init_process_group("gloo")
    meter = Meter()
    for _ in range(2):
        for state in meter.states.values():
            state += 1
        meter.sync()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
