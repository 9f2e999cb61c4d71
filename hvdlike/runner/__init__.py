"""``hvdlikerun``: start a training script as N MPI ranks (see docs/launcher.md).

Standard library only: importing the runner never loads MPI, NumPy or TensorFlow.
"""
from .command import LaunchError, build_command, format_command
from .launch import main
from .mpi_flavor import Flavor, find_mpirun, parse_flavor
from .process import run_command

__all__ = ["Flavor", "LaunchError", "build_command", "find_mpirun", "format_command", "main",
           "parse_flavor", "run_command"]
