"""hvdlike: Horovod-style data-parallel training on MPI.

``import hvdlike as hvd; hvd.init()``; then collectives on NumPy arrays or TensorFlow values
(those go to ``hvdlike.tensorflow``). This module imports neither MPI (that happens in ``init``)
nor TensorFlow: the TensorFlow names below load it on first use, and ``run`` (Horovod's
``horovod.run``) the launcher.
"""
import importlib as _importlib
from . import collectives as _collectives
from .collectives import (
    allgather_async,
    allreduce_async,
    alltoall_async,
    broadcast_async,
    grouped_allgather_async,
    grouped_allreduce_async,
    grouped_reducescatter_async,
    reducescatter_async,
)
from .control_collectives import (
    allgather_object,
    barrier,
    broadcast_object,
    exclusive_mpi,
    join,
)
from .tf_dispatch import accepts_tf_values as _accepts_tf_values, pin_gpu

# the blocking collectives take TensorFlow values too, handed to hvdlike.tensorflow
allreduce = _accepts_tf_values(_collectives.allreduce)
grouped_allreduce = _accepts_tf_values(_collectives.grouped_allreduce)
allgather = _accepts_tf_values(_collectives.allgather)
grouped_allgather = _accepts_tf_values(_collectives.grouped_allgather)
broadcast = _accepts_tf_values(_collectives.broadcast)
alltoall = _accepts_tf_values(_collectives.alltoall)
reducescatter = _accepts_tf_values(_collectives.reducescatter)
grouped_reducescatter = _accepts_tf_values(_collectives.grouped_reducescatter)
from . import elastic
from .base.errors import (CollectiveMismatchError, DeadlockError, HostsUpdatedInterrupt,
                          NotInitializedError, RanksFailedError)
from .handles import Handle, poll, synchronize
from .process_sets import (ProcessSet, add_process_set, comm_process_set_id, init,
                           get_process_set_ids_and_ranks, global_process_set,
                           remove_process_set)
from .base.reduce_ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from .engine.timeline import stop_timeline
from .runtime import start_timeline
from .runtime.capabilities import (
    ccl_built,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    gpu_available,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rocm_built,
    sycl_built,
)
from .runtime import (
    cross_rank,
    cross_size,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)

__version__ = "0.1.0"
HorovodInternalError = RanksFailedError  # Horovod's name

_LAZY_NAMES = {  # loaded on first use: TensorFlow, the launcher
    "hvdlike.runner.run_func": ("run",),
    "hvdlike.tensorflow": ("DistributedOptimizer", "DistributedGradientTape", "Compression",
                           "broadcast_variables", "broadcast_global_variables", "shard_dataset"),
    "hvdlike.tensorflow.keras": ("callbacks", "load_model"),
    "hvdlike.tensorflow.keras.callbacks": (
        "BroadcastGlobalVariablesCallback", "MetricAverageCallback",
        "LearningRateWarmupCallback", "LearningRateScheduleCallback"),
}
_LAZY_MODULE_OF = {name: module for module, names in _LAZY_NAMES.items() for name in names}


def __getattr__(name: str):  # noqa: ANN201 - module-level lazy attributes
    module = _LAZY_MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'hvdlike' has no attribute {name!r}")
    return getattr(_importlib.import_module(module), name)
