"""Per-task confusion matrices summed over ranks, one all_reduce per task, the tasks kept
in a set: each process iterates a set of strings in the order of their hashes, which
Python randomises per process, so rank 0's n-th all_reduce is another task's matrix
(another size) than rank 1's. MODE=fixed iterates the tasks sorted."""

import os

import torch
import torch.distributed as dist

CLASSES = {f"task_{name}": size for size, name in enumerate("abcdefghij", start=2)}


def sync(confusions: dict[str, torch.Tensor]) -> None:
    for _task, matrix in confusions.items():
        dist.all_reduce(matrix)


def main() -> None:
    dist.init_process_group("gloo")
    enabled = set(CLASSES) - set(os.environ.get("SKIP_TASKS", "").split(","))
    if os.environ.get("MODE") == "fixed":
        enabled = sorted(enabled)
    confusions = {task: torch.zeros(CLASSES[task], CLASSES[task]) for task in enabled}
    with torch.no_grad():
        for _ in range(2):
            for matrix in confusions.values():
                matrix += 1
            sync(confusions)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
