"""Messages past 2 GiB (MPI's int counts): one broadcast of 2 GiB + 4 KiB, one all-gather of
1.1 GiB per rank (2.2 GiB gathered), checked on every rank."""
from typing import Any, Dict

import numpy as np

import hvdlike as hvd


def large() -> Dict[str, Any]:
    r, n = hvd.rank(), hvd.size()
    out: Dict[str, Any] = {}
    size = (1 << 31) + 4096
    x = np.full(size, 7, np.uint8) if r == n - 1 else np.zeros(size, np.uint8)
    x[-1] = 9 if r == n - 1 else 0
    y = hvd.broadcast(x, n - 1, name="large.broadcast")
    del x
    out["broadcast"] = (y.size, bool((y[:-1] == 7).all()), int(y[-1]))
    del y
    rows = (1 << 30) + (1 << 26)  # 1.1 GiB of uint8 per rank
    g = hvd.allgather(np.full(rows, r + 1, np.uint8), name="large.allgather")
    out["allgather"] = (g.size, [bool((g[q * rows:(q + 1) * rows] == q + 1).all())
                                 for q in range(n)])
    return out
