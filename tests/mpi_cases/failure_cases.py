"""Scripts for the failure tests, run directly by mpirun (not through the worker)."""
import sys

import numpy as np

mode = sys.argv[1]
if mode == "plain_mpi4py":
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    if comm.rank == 1:
        raise RuntimeError("rank 1 fails before the allreduce")
    comm.allreduce(1)
else:
    import hvdlike as hvd
    hvd.init(abort_on_exception=(mode != "opt_out"))
    if hvd.rank() == 1:
        raise RuntimeError("rank 1 fails before the allreduce")
    hvd.allreduce(np.ones(2))
