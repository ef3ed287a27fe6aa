"""A rank-conditional hang whose ranks dump their Flight Recorder (JSON) as they enter it.

Rank 0 all-reduces a metric that rank 1 never reduces; rank 1 goes on to a barrier.
Each rank writes ``<TORCH_FR_DUMP_TEMP_FILE><rank>`` the way a job's own signal
handler or torch's debug server would, then waits for its collective forever.
"""

import datetime
import os

import torch
import torch.distributed as dist


def dump_flight_recorder() -> None:
    path = os.environ["TORCH_FR_DUMP_TEMP_FILE"] + os.environ["RANK"]
    with open(path + ".partial", "wb") as handle:  # the dump is bytes
        handle.write(torch._C._distributed_c10d._dump_fr_trace_json(True, True))
    os.replace(path + ".partial", path)


def main() -> None:
    timeout = datetime.timedelta(seconds=float(os.environ.get("REPRO_TIMEOUT_S", "600")))
    dist.init_process_group("gloo", timeout=timeout)
    value = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(value)
    if dist.get_rank() == 0:  # noqa: SIM108 (the two sides are the point of the script)
        work = dist.all_reduce(value, async_op=True)  # a metric only rank 0 reduces
    else:
        work = dist.barrier(async_op=True)
    dump_flight_recorder()
    work.wait()


if __name__ == "__main__":
    main()
