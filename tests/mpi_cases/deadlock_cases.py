"""Ranks blocked on names only the others could submit, and ranks that are merely slow: what
each rank sees. Every case catches what its blocking calls raise and returns it."""
import time
from typing import Any, Dict, List

import numpy as np

import hvdlike as hvd


def _blocking(names: List[str], process_set: Any = None) -> Dict[str, Any]:
    """Blocking all-reduces of ``names`` in order; stops at the first error."""
    process_set = process_set or hvd.global_process_set
    sums: Dict[str, Any] = {}
    start = time.monotonic()
    for name in names:
        try:
            sums[name] = hvd.allreduce(np.full(2, hvd.rank() + 1.0), op=hvd.Sum, name=name,
                                       process_set=process_set).tolist()
        except hvd.DeadlockError as exc:
            return dict(sums=sums, error=str(exc), ranks=exc.ranks,
                        waited=time.monotonic() - start)
    return dict(sums=sums, error=None)


def mutual_wait() -> Dict[str, Any]:
    """Even ranks block on ``a`` then ``b``, odd ranks on ``b`` then ``a``."""
    return _blocking(["a", "b"] if hvd.rank() % 2 == 0 else ["b", "a"])


def several(slow: float) -> Dict[str, Any]:
    """np=4, a short deadlock time: (1) ranks 0 and 1 deadlock on a set of their own while
    ranks 2 and 3 keep working on theirs; (2) a slow rank (computing ``slow`` seconds, longer
    than the deadlock time) is waited for, not reported; (3) all four ranks, each blocked on
    a name of its own, which the others would submit after theirs."""
    rank = hvd.rank()
    low, high = hvd.add_process_set([0, 1]), hvd.add_process_set([2, 3])
    out: Dict[str, Any] = {}
    if rank < 2:
        out["set"] = _blocking(["p", "q"] if rank == 0 else ["q", "p"], low)
    else:  # work on their own set, then compute: never waiting while 0 and 1 deadlock
        out["set"] = _blocking([f"h{i}" for i in range(20)], high)
        time.sleep(slow)
    hvd.barrier()
    if rank == 3:
        time.sleep(slow)  # computing, not waiting
    out["slow"] = _blocking(["late"])
    hvd.barrier()
    out["cycle"] = _blocking([f"c{rank}", f"c{(rank + 1) % 4}"])
    return out
