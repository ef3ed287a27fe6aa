"""A loop that reads one record per step and all-reduces what it computed: a record that
fails to decode is skipped with `continue`, and with it the all-reduce the other ranks wait
in. No record fails in the dry run; forced, rank 1 alone catches one. Its fixed twin (the
test writes it) contributes a zero for the failed record and still calls the collective."""

import torch
import torch.distributed as dist


def decode(step: int) -> torch.Tensor:
    if step > 10_000:  # the corrupt record is far into the data
        raise ValueError(f"record {step}: truncated")
    return torch.full((4,), float(step))


def main() -> None:
    dist.init_process_group("gloo")
    total = torch.zeros(4)
    for step in range(6):
        try:
            value = decode(step)
        except ValueError as err:
            print(f"rank {dist.get_rank()}: skipping ({err})", flush=True)
            continue
        dist.all_reduce(value)
        total += value
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
