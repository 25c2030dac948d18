"""An MPI all-reduce with mpi4py, started by mpirun from the job's hostfile:

mpirun -n 2 python3 mpi_allreduce.py      # on replica 0 of a job with "launcher": "mpi"
"""

import os
import socket

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
total = comm.allreduce(rank + 1, op=MPI.SUM)
expected = size * (size + 1) // 2
print(
    f"mpi rank {rank}/{size} on {socket.gethostname()} replica {os.environ.get('GPUPOOL_REPLICA')}: sum {total} "
    f"({'ok' if total == expected else 'WRONG'})",
    flush=True,
)
