"""hvdlike for TensorFlow 2 (like ``horovod.tensorflow``): re-exports only."""
from hvdlike import (  # noqa: F401
    init, shutdown, is_initialized, rank, size, local_rank, local_size, cross_rank,
    cross_size, ReduceOp, Average, Sum, Min, Max, Product, Adasum, ProcessSet, global_process_set,
    add_process_set, remove_process_set, comm_process_set_id, get_process_set_ids_and_ranks,
    CollectiveMismatchError, DeadlockError, NotInitializedError, RanksFailedError,
    HostsUpdatedInterrupt,
    HorovodInternalError,
    mpi_enabled, mpi_built, mpi_threads_supported, gloo_enabled, gloo_built, nccl_built,
    cuda_built, gpu_available, rocm_built, sycl_built, ccl_built, ddl_built, pin_gpu,
    is_homogeneous, start_timeline, stop_timeline, exclusive_mpi,
)

from hvdlike.tensorflow.compression import Compression  # noqa: F401
from hvdlike.tensorflow.ops import (  # noqa: F401
    allreduce, grouped_allreduce, reducescatter, grouped_reducescatter,
)
from hvdlike.tensorflow.gather_ops import (  # noqa: F401
    allgather, grouped_allgather, broadcast, alltoall,
)
from hvdlike.tensorflow.control_ops import (  # noqa: F401
    join, barrier, rank_op, size_op, local_rank_op, local_size_op, process_set_included_op,
)
from hvdlike.tensorflow.tape import (  # noqa: F401
    DistributedGradientTape, PartialDistributedGradientTape,
)
from hvdlike.tensorflow.optimizer import (  # noqa: F401
    DistributedOptimizer, PartialDistributedOptimizer,
)
from hvdlike.tensorflow.optimizer_v1 import BroadcastGlobalVariablesHook  # noqa: F401
from hvdlike.tensorflow.functions import (  # noqa: F401
    broadcast_variables, broadcast_global_variables, broadcast_object, allgather_object,
    broadcast_, broadcast_object_fn,
)
from hvdlike.tensorflow.data import shard_dataset  # noqa: F401
from hvdlike.tensorflow.sync_batch_norm import SyncBatchNormalization  # noqa: F401
from hvdlike.tensorflow.tf_config_emulation import tf_config, export_tf_config  # noqa: F401
from hvdlike.tensorflow.strategy import MPIStrategy, MPICrossDeviceOps  # noqa: F401
from hvdlike.tensorflow.parameter_server import ParameterServerTraining  # noqa: F401

from hvdlike.tensorflow import elastic, mpi_ops, util  # noqa: F401,E402
from hvdlike.tensorflow.util import _executing_eagerly  # noqa: F401,E402
