"""One tensor past 2 GiB works (MPI counts are C ints: the MPI transport moves such messages
in pieces). Needs about 9 GB of memory for the two ranks; the pieces' logic on small data is
also covered by every collective case in test_collectives.py ("pieces" configurations)."""
import os

import pytest

from mpi_harness import run_mpi


def _free_bytes() -> int:
    with open("/proc/meminfo") as f:
        info = dict(line.split(":", 1) for line in f)
    return int(info["MemAvailable"].split()[0]) * 1024


@pytest.mark.skipif(not os.path.exists("/proc/meminfo") or _free_bytes() < 12 << 30,
                    reason="needs 12 GB of free memory for two ranks with 2 GiB messages")
def test_broadcast_and_allgather_past_2_gib_are_right_on_every_rank():
    for res in run_mpi(2, "large_cases:large", timeout=300, env={"HVDLIKE_SHM_BUFFER": "0"}):
        assert res["broadcast"] == ((1 << 31) + 4096, True, 9)
        assert res["allgather"] == (2 * ((1 << 30) + (1 << 26)), [True, True])
