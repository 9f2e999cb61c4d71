"""Run on the test cluster's ranks: prints one ``RESULT <json>`` line per rank with the
topology hvdlike found, collective results, and which transport each all-reduce took (from
the rank's timeline, in HVDLIKE_TIMELINE)."""
import json
import os
import socket

import numpy as np

import hvdlike as hvd
from hvdlike.testing.cluster import bytes_sent
from hvdlike.engine.timeline import rank_file

hvd.init()
rank, size = hvd.rank(), hvd.size()


# a process set of the ranks on host 0 and one spanning hosts (first rank of each host)
hosts = hvd.allgather_object(socket.gethostname())
host0 = [r for r in range(size) if hosts[r] == hosts[0]]
leaders = [r for r in range(size) if hosts.index(hosts[r]) == r]
inside = hvd.add_process_set(host0)
across = hvd.add_process_set(leaders)
big = np.arange(1 << 18, dtype=np.float32) + rank  # 1 MiB: shared memory where it can
out = {
    "rank": rank, "host": socket.gethostname(), "hosts": hosts,
    "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
    "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(),
    "homogeneous": hvd.is_homogeneous(),
    "sum": hvd.allreduce(big, op=hvd.Sum, name="world").sum().item(),
    "gather": hvd.allgather(np.full((rank + 1, 2), rank), name="gather")[:, 0].tolist(),
    "bcast": hvd.broadcast(np.full(3, rank), root_rank=size - 1, name="bcast").tolist(),
}
# a ragged all-gather of 2 MiB: what this host sent over its link while it ran (its local
# rank 0 reads the host's counter; every rank of a host shares its network namespace)
rows = (1 << 19) // sum(range(1, size + 1)) * (rank + 1)
hvd.barrier()
tx_before = bytes_sent()
ragged = hvd.allgather(np.full(rows, float(rank), np.float32), name="ragged")
hvd.barrier()
out["ragged_sent"] = bytes_sent() - tx_before if hvd.local_rank() == 0 else None
out["ragged_ok"] = bool(np.array_equal(ragged, np.repeat(
    np.arange(size, dtype=np.float32), hvd.allgather(np.array([rows]), name="rows"))))
out["ragged_rows"] = rows
if rank in host0:
    out["inside_sum"] = hvd.allreduce(big, op=hvd.Sum, name="inside",
                                      process_set=inside).sum().item()
if rank in leaders:
    out["across_sum"] = hvd.allreduce(big, op=hvd.Sum, name="across",
                                      process_set=across).sum().item()
hvd.stop_timeline()
with open(rank_file(os.environ["HVDLIKE_TIMELINE"], rank)) as f:
    events = json.load(f)
rows = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
out["transports"] = sorted({f"{rows[e['tid']].split(' (')[0]}:{e['name']}" for e in events
                            if e["name"] in ("SHM_ALLREDUCE", "CMA_ALLREDUCE",
                                             "HIERARCHICAL_ALLREDUCE", "MPI_ALLREDUCE")})
print("RESULT " + json.dumps(out), flush=True)
