"""The check at ``hvd.init()`` that the processes a launcher started share one MPI world.

A launcher of another MPI than the one mpi4py loaded, or ``srun`` with no PMI plugin that this
MPI reads, starts processes that each see a world of 1 and would train alone, silently.
"""
import os
from types import ModuleType
from typing import Mapping, Optional, Tuple

_LAUNCHED_SIZE = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")  # Open MPI's; MPICH's and Intel MPI's
_MOST_LEVELS = 64  # a process tree deeper than this below a task is not a launcher's


def check(MPI: ModuleType, env: Mapping[str, str]) -> None:
    """Raise where the launcher started several processes but this one's MPI world is 1."""
    if MPI.COMM_WORLD.Get_size() != 1:
        return
    variable, launched = launched_size(env)
    if launched > 1:
        library = MPI.Get_library_version().strip().splitlines()[0].split(",")[0]
        where = ("srun started its tasks without a PMI plugin this MPI reads (srun "
                 "--mpi=pmix for Open MPI, --mpi=pmi2 for MPICH; `srun --mpi=list`)"
                 if variable.startswith("SLURM") else "the launcher is another MPI's")
        raise RuntimeError(
            f"hvdlike.init: the launcher started {launched} processes ({variable}="
            f"{launched}), but the MPI that mpi4py loaded ({library}) sees a world of 1 "
            f"here: {where}, and each process would train alone. "
            "Start the job with the mpirun of mpi4py's MPI (`hvdlikerun --check-build` "
            "names it; hvdlikerun uses it, and picks srun's plugin), or build mpi4py against "
            "your MPI (docs/troubleshooting.md).")


def launched_size(env: Mapping[str, str]) -> Tuple[str, int]:
    """The variable that says how many processes the launcher started, and that number
    (``("", 1)`` where none says). An MPI launcher's variable wins; Slurm's
    ``SLURM_STEP_NUM_TASKS`` counts only in a task ``srun`` started (``SLURM_TASK_PID``) and
    in the processes below it (a wrapper script's ``python``, ``conda run``'s): the ranks of
    an ``mpirun`` inside an allocation inherit the step of its daemons, and carry their MPI's
    variable."""
    for variable in _LAUNCHED_SIZE:
        value = env.get(variable, "")
        if value.isdigit():
            return variable, int(value)
    value, task = env.get("SLURM_STEP_NUM_TASKS", ""), env.get("SLURM_TASK_PID", "")
    if value.isdigit() and task.isdigit() and _is_self_or_ancestor(int(task)):
        return "SLURM_STEP_NUM_TASKS", int(value)
    return "", 1


def _is_self_or_ancestor(pid: int) -> bool:
    """Whether ``pid`` is this process or one it descends from (its parent's parent, ...)."""
    chain = [os.getpid(), os.getppid()]
    while pid not in chain and chain[-1] > 1 and len(chain) < _MOST_LEVELS:
        parent = parent_of(chain[-1])
        if parent is None:
            break
        chain.append(parent)
    return pid in chain


def parent_of(pid: int) -> Optional[int]:
    """The parent of ``pid`` (Linux's /proc), or None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # "pid (command) state ppid ...": the command may hold spaces and parentheses
    return int(stat[stat.rindex(b")") + 2:].split()[1])
