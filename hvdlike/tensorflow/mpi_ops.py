"""Horovod's ``horovod.tensorflow.mpi_ops`` names, for scripts that import from that module
(``from hvdlike.tensorflow.mpi_ops import allgather, rank, Sum``): re-exports of
``hvdlike.tensorflow``, plus ``_allreduce``, the raw op that Horovod's custom compressors call."""
from typing import Any, Optional

import tensorflow as tf

from hvdlike.tensorflow import (  # noqa: F401
    init, shutdown, is_initialized, start_timeline, stop_timeline, size, local_size,
    cross_size, rank, local_rank, cross_rank, is_homogeneous, mpi_threads_supported,
    mpi_enabled, mpi_built, gloo_enabled, gloo_built, nccl_built, ddl_built, ccl_built,
    cuda_built, rocm_built, sycl_built, Average, Sum, Adasum, Min, Max, Product, ProcessSet,
    global_process_set, add_process_set, remove_process_set, allgather, grouped_allgather,
    broadcast, broadcast_, alltoall, reducescatter, grouped_reducescatter, join, barrier,
    size_op, local_size_op, rank_op, local_rank_op, process_set_included_op,
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
