"""A Slurm job's program (scripts/slurm/*.sbatch with TRAIN set to this file): each rank
prints one ``RESULT <json>`` line with where it ran and an all-reduce's result."""
import json
import socket

import numpy as np

import hvdlike as hvd

hvd.init()
x = np.full(1 << 18, hvd.rank() + 1, np.float32)  # 1 MiB: shared memory within a host
total = hvd.allreduce(x, op=hvd.Sum, name="slurm")
print("RESULT " + json.dumps({
    "rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
    "local_size": hvd.local_size(), "cross_size": hvd.cross_size(),
    "host": socket.gethostname(), "sum": float(total[0]), "same": bool((total == total[0]).all()),
}), flush=True)
