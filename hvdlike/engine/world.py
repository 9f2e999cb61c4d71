"""What the engine uses of the world it runs in (``runtime.State`` has it): the settings, the
ranks and their communicators, and the MPI transport module."""
from types import ModuleType
from typing import Any, Dict, List, Protocol

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
    node_of_rank: List[int]  # per world rank: the world rank of its node's local rank 0
    host_of_node: Dict[int, str]  # that rank's host name, by node

    @property
    def nodes_in_blocks(self) -> bool:
        """Several nodes with the same number of ranks each, numbered node after node."""
