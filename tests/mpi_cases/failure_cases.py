"""Scripts for the failure tests, run directly by mpirun (not through the worker).

``python failure_cases.py MODE [RANK]``: rank RANK (default 1) raises before an all-reduce."""
import sys
import time

import numpy as np

mode = sys.argv[1]
failing = int(sys.argv[2]) if len(sys.argv) > 2 else 1
if mode == "plain_mpi4py":
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    if comm.rank == failing:
        raise RuntimeError(f"rank {failing} fails before the allreduce")
    comm.allreduce(1)
else:
    import hvdlike as hvd
    hvd.init(abort_on_exception=(mode != "opt_out"))
    if hvd.rank() == failing:
        print(f"FAILING_AT {time.time():.3f}", flush=True)
        raise RuntimeError(f"rank {failing} fails before the allreduce")
    hvd.allreduce(np.ones(2))
