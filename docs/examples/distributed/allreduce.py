"""All-reduce across every process of the job, with no rank arguments: torch.distributed reads RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT from the environment (gpupool's launch contract, or torchrun's when run under it).

    python3 allreduce.py            # one process per replica (env://)
    torchrun allreduce.py           # torchrun on each replica: PET_* give it nodes, node rank and master
"""

import os
import socket

import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)  # sum of 1..world
expected = world * (world + 1) / 2
print(
    f"rank {rank}/{world} local_rank {os.environ.get('LOCAL_RANK')} on {socket.gethostname()} "
    f"master {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}: sum {value.item():g} "
    f"({'ok' if value.item() == expected else 'WRONG'})",
    flush=True,
)
dist.barrier()
dist.destroy_process_group()
