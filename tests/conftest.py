import os
import sys
from pathlib import Path

# Open MPI's ofi BTL finds no fabric on a machine without one, and closing it then sleeps 1 s
# in every process's MPI_Init (gdb: sleep() under mca_btl_base_select; a one-rank MPI_Init
# takes 1.09 s with it, 0.10 s without). The BTLs that initialise are the same without it
# (self, sm, tcp, uct; btl_base_verbose). hvd.init() leaves it out where it has nothing to do
# (hvdlike/transport/open_mpi_defaults.py); the suite leaves it out of every job it starts
# (raw-MPI baselines and launcher tests too) unless OMPI_MCA_btl is set; test_runtime's BTL
# tests unset it to check hvdlike's own default. test_stall, test_engine and test_runtime took
# 116 s instead of 172 s.
os.environ.setdefault("OMPI_MCA_btl", "^ofi")

sys.path.insert(0, str(Path(__file__).resolve().parent / "mpi_cases"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# The files that take longest (scripts/suite_times.py), run first: scripts/run_tests.sh hands
# whole files to two pytest workers in collection order, so a long file left to the end would
# keep one worker busy after the other has finished.
LONGEST_FIRST = ("tf/test_tf_scripts.py", "test_cluster.py", "tf/test_tf_training.py",
                 "tf/test_tf_strategy.py", "tf/test_tf_ops.py", "tf/test_tf_parameter_server.py",
                 "tf/test_tf_elastic.py", "test_shm.py")


def pytest_collection_modifyitems(session, config, items):
    tests = Path(__file__).resolve().parent

    def rank(item):
        path = Path(str(item.fspath)).resolve().relative_to(tests).as_posix()
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the rest keep their order
