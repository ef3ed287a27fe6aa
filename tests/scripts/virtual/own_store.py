"""A script that sets up its process group with an address of its own: a virtual world
cannot give it one."""

import torch.distributed as dist

dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29999", rank=0, world_size=1)
dist.barrier()
