"""An OpenMPI job (mpirun inside an allocation starts the ranks): rank, size, node and the sum
of rank + 1 over all ranks, through mpi4py."""

from __future__ import annotations

from mpi4py import MPI

comm = MPI.COMM_WORLD
total = comm.allreduce(comm.Get_rank() + 1, op=MPI.SUM)
library = MPI.Get_library_version().splitlines()[0].strip()
print(
    f"rank {comm.Get_rank()}/{comm.Get_size()} on {MPI.Get_processor_name()} "
    f"allreduce={total} {library}",
    flush=True,
)
