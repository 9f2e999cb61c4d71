"""What the engine uses of the world it runs in (``runtime.State`` has it): the settings, the
ranks and their communicators, and the MPI transport module."""
from types import ModuleType
from typing import Any, Protocol

from ..base.settings import Settings


class World(Protocol):
    settings: Settings
    mpi: ModuleType  # mpi4py.MPI
    transport: ModuleType  # hvdlike.transport.mpi
    world: Any  # the world's communicator
    rank: int
    size: int
    local_comm: Any
    cross_comm: Any

    @property
    def nodes_in_blocks(self) -> bool:
        """Several nodes with the same number of ranks each, numbered node after node."""
