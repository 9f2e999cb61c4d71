"""hvd.init() with HVDLIKE_TIMELINE where one rank's file cannot be written: prints
``RAISED rank=<r> <type>: <message>`` on each rank that got the error (no MPI job hangs)."""
import os

import hvdlike as hvd

rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "?"))
try:
    hvd.init()
    print(f"INITIALIZED rank={rank}", flush=True)
    hvd.shutdown()
except OSError as exc:
    print(f"RAISED rank={rank} {type(exc).__name__}: {exc}", flush=True)
