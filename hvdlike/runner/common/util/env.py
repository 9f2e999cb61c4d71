"""A process's rank and job size before ``hvd.init()``, from its launcher's variables."""
import os
from typing import Tuple

# (rank, size) variables: Open MPI, MPICH and Intel MPI (PMI), Slurm's srun, Horovod's
_PAIRS = (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
          ("SLURM_PROCID", "SLURM_NTASKS"), ("HOROVOD_RANK", "HOROVOD_SIZE"))


def get_env_rank_and_size() -> Tuple[int, int]:
    """This process's rank and the job's size as its launcher set them; (0, 1) when it was
    started without one."""
    for rank, size in _PAIRS:
        if rank in os.environ and size in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
        if rank in os.environ or size in os.environ:
            raise RuntimeError(f"cannot tell this process's rank and the job's size: "
                               f"{rank if rank in os.environ else size} is set, "
                               f"{size if rank in os.environ else rank} is not")
    return 0, 1
