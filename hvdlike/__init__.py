"""hvdlike: Horovod-style data-parallel training on MPI.

``import hvdlike as hvd; hvd.init()``; then collectives on NumPy arrays. This module imports
neither MPI (that happens in ``init``) nor TensorFlow.
"""
from .collectives import (
    allgather,
    allgather_async,
    allgather_object,
    allreduce,
    allreduce_async,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_async,
    broadcast_object,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_async,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    reducescatter,
    reducescatter_async,
)
from .errors import CollectiveMismatchError, NotInitializedError
from .handles import Handle, poll, synchronize
from .process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .reduce_ops import Average, Max, Min, Product, ReduceOp, Sum
from .runtime import (
    cross_rank,
    cross_size,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    shutdown,
    size,
)

__version__ = "0.1.0"
