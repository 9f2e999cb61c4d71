"""Horovod's ``horovod.tensorflow.mpi_ops`` names, for scripts that import from that module
(``from hvdlike.tensorflow.mpi_ops import allgather, rank, Sum``): re-exports of
``hvdlike.tensorflow``, plus ``_allreduce``, the raw op that Horovod's custom compressors call."""
from typing import Any, Optional

import tensorflow as tf

from hvdlike.tensorflow import (  # noqa: F401
    Adasum,
    Average,
    Max,
    Min,
    ProcessSet,
    Product,
    Sum,
    add_process_set,
    allgather,
    alltoall,
    barrier,
    broadcast,
    broadcast_,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    global_process_set,
    gloo_built,
    gloo_enabled,
    grouped_allgather,
    grouped_reducescatter,
    init,
    is_homogeneous,
    is_initialized,
    join,
    local_rank,
    local_rank_op,
    local_size,
    local_size_op,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    process_set_included_op,
    rank,
    rank_op,
    reducescatter,
    remove_process_set,
    rocm_built,
    shutdown,
    size,
    size_op,
    start_timeline,
    stop_timeline,
    sycl_built,
)
from hvdlike.tensorflow.ops import allreduce


def _allreduce(tensor: Any, name: Optional[str] = None, op: Any = Sum,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               ignore_name_scope: bool = False,
               process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Horovod's raw all-reduce of one tensor: a Sum by default (``hvd.allreduce`` averages),
    no compression; differentiable like ``hvd.allreduce``."""
    return allreduce(tensor, op=op, prescale_factor=prescale_factor,
                     postscale_factor=postscale_factor, name=name, process_set=process_set,
                     ignore_name_scope=ignore_name_scope)
