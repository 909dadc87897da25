"""An MPICH job step (srun --mpi=pmi2 starts each rank): rank, size, the sum of rank + 1 over
all ranks, and the library's version. MPICH through ctypes: Debian's mpi4py is linked to
OpenMPI, and the image has no C compiler. Handles and constants are MPICH's own ABI (mpi.h)."""

from __future__ import annotations

import ctypes
import socket

MPI_COMM_WORLD = 0x44000000
MPI_INT = 0x4C000405
MPI_SUM = 0x58000003
MPI_MAX_LIBRARY_VERSION_STRING = 8192

mpi = ctypes.CDLL("libmpich.so.12", mode=ctypes.RTLD_GLOBAL)


def check(rc: int, what: str) -> None:
    if rc != 0:
        raise SystemExit(f"{what} returned {rc}")


check(mpi.MPI_Init(None, None), "MPI_Init")
rank, size = ctypes.c_int(), ctypes.c_int()
check(mpi.MPI_Comm_rank(MPI_COMM_WORLD, ctypes.byref(rank)), "MPI_Comm_rank")
check(mpi.MPI_Comm_size(MPI_COMM_WORLD, ctypes.byref(size)), "MPI_Comm_size")
mine, total = ctypes.c_int(rank.value + 1), ctypes.c_int()
check(
    mpi.MPI_Allreduce(ctypes.byref(mine), ctypes.byref(total), 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD),
    "MPI_Allreduce",
)
version = ctypes.create_string_buffer(MPI_MAX_LIBRARY_VERSION_STRING)
length = ctypes.c_int()
check(mpi.MPI_Get_library_version(version, ctypes.byref(length)), "MPI_Get_library_version")
library = version.value.decode().split("\n")[0].strip()
print(
    f"rank {rank.value}/{size.value} on {socket.gethostname()} allreduce={total.value} {library}",
    flush=True,
)
check(mpi.MPI_Finalize(), "MPI_Finalize")
