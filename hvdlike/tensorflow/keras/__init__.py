"""hvdlike for Keras on TensorFlow (like ``horovod.tensorflow.keras``): re-exports only."""
from hvdlike.tensorflow import (  # noqa: F401
    init, shutdown, is_initialized, rank, size, local_rank, local_size, cross_rank,
    cross_size, ReduceOp, Average, Sum, Min, Max, Product, Adasum, ProcessSet, global_process_set,
    add_process_set, remove_process_set, comm_process_set_id, get_process_set_ids_and_ranks,
    CollectiveMismatchError, NotInitializedError, Compression, allreduce, grouped_allreduce,
    allgather, grouped_allgather, broadcast,
    alltoall, reducescatter, grouped_reducescatter, join, barrier, DistributedOptimizer,
    DistributedGradientTape, broadcast_variables, broadcast_global_variables,
    broadcast_object, allgather_object, shard_dataset, broadcast_, broadcast_object_fn,
    mpi_enabled, mpi_built, mpi_threads_supported, gloo_enabled, gloo_built, nccl_built,
    cuda_built, gpu_available, rocm_built, sycl_built, ccl_built, ddl_built, is_homogeneous,
    start_timeline, stop_timeline, pin_gpu, PartialDistributedOptimizer,
    PartialDistributedGradientTape,
    SyncBatchNormalization,
)
from hvdlike.tensorflow.keras import callbacks  # noqa: F401
from hvdlike.tensorflow.keras.saving import load_model  # noqa: F401
from hvdlike.tensorflow.keras import elastic  # noqa: F401,E402
