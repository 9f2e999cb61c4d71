"""Scripts for the stall inspector tests, run directly under hvdlikerun.

``python stall_cases.py MODE MISSING``: rank MISSING does not submit a collective that the
other ranks wait for. Modes:

* ``cached``: the tensor ran twice before (the engine has it cached), then MISSING sleeps;
* ``new``: a name never seen before;
* ``unnamed``: a collective without a name;
* ``late``: MISSING comes 2.5 s late; everyone prints the result;
* ``process_set``: a collective of the process set [1, 2, 3] that MISSING skips;
* ``joined``: as ``process_set``, MISSING (and rank 0, outside the set) call hvdlike.join();
* ``stopped``: MISSING stops its whole process (SIGSTOP), engine included;
* ``finished``: MISSING's script ends (exit status 0) where the others call one more.

Rank 0 prints ``STALL_START <unix time>`` when the wait begins.
"""
import os
import signal
import sys
import time

import numpy as np

import hvdlike as hvd

mode, missing = sys.argv[1], int(sys.argv[2])
hvd.init()
rank = hvd.rank()
process_set = hvd.global_process_set
if mode in ("process_set", "joined"):
    process_set = hvd.add_process_set([1, 2, 3])
name = {"new": "a_new_name", "unnamed": None}.get(mode, "layer1/kernel")
if mode in ("cached", "stopped"):
    for _ in range(2):
        hvd.allreduce(np.ones(3), name=name)
hvd.barrier()
if rank == 0:
    print(f"STALL_START {time.time():.3f}", flush=True)
if mode == "joined" and (rank == missing or rank not in process_set.ranks):
    hvd.join()  # stands in for global all-reduces only: the set's members wait for MISSING
if rank == missing:
    if mode == "finished":
        sys.exit(0)
    if mode == "stopped":
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(2.5 if mode == "late" else 60)
if rank in process_set.ranks:
    out = hvd.allreduce(np.full(3, float(rank)), op=hvd.Sum, name=name, process_set=process_set)
    print(f"RESULT rank={rank} {out.tolist()}", flush=True)
