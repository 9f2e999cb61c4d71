"""``MPIStrategy``: a real ``tf.distribute.Strategy`` whose cross-process reduction is hvdlike's.

Code written for ``tf.distribute.MultiWorkerMirroredStrategy`` runs under
``mpirun -np N python train.py`` by changing only the line that creates the strategy::

    strategy = hvdlike.tensorflow.MPIStrategy()   # was: tf.distribute.MultiWorkerMirroredStrategy()

Design.  ``MPIStrategy`` subclasses ``tf.distribute.MultiWorkerMirroredStrategy`` (so
Keras treats it as multi-worker: global logs, ``predict`` gathered from all ranks) but its
internals are ``MirroredStrategy``'s over this process's device(s) (one GPU per process,
chosen by local rank, or the CPU) with ``MPICrossDeviceOps`` as its
``tf.distribute.CrossDeviceOps``; TF's gRPC collective runtime is never started.  Values
are first summed over the process's local replicas and then reduced across ranks by the
hvdlike engine: one fused call per ``batch_reduce`` eagerly, requests in buckets
inside ``tf.function`` so that they overlap backprop.  The strategy's extended object reports the global picture the way
``MultiWorkerMirroredStrategy`` does: ``num_replicas_in_sync`` = replicas per process x
ranks, global replica ids (rank-major), per-rank dataset sharding and splitting of the
global batch, initial variable values broadcast from rank 0, chief-only checkpointing,
and a ``cluster_resolver`` with ``task_type``/``task_id``.

TensorFlow offers no public API to build a ``Strategy`` from scratch; the extension
points used here (``MirroredExtended`` and its ``_reduce_to``/``_batch_reduce_to``/
``_num_replicas_in_sync``/input-context hooks, the same ones
``MultiWorkerMirroredStrategy`` overrides) are private; they are all in this file and are
tested with TF 2.21 (Keras 3.15 and tf_keras).
"""
import socket
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

# Private TensorFlow modules: the strategy extension points.  Kept in this one module.
from tensorflow.python.distribute import cross_device_ops as _cdo
from tensorflow.python.distribute import cross_device_utils as _cdu
from tensorflow.python.distribute import distribute_utils as _dutils
from tensorflow.python.distribute import input_util as _input_util
from tensorflow.python.distribute import mirrored_strategy as _mirrored
from tensorflow.python.distribute import values as _values
from tensorflow.python.trackable import base as _trackable_base

import hvdlike as _core
from hvdlike import Sum, global_process_set
from hvdlike.tensorflow import bridge, gather_ops
from hvdlike.tensorflow.compression import Compression
from hvdlike.tensorflow.gradients import allreduce_gradients

_SUM = tf.distribute.ReduceOp.SUM
_MEAN = tf.distribute.ReduceOp.MEAN


def _ensure_init() -> None:
    if not _core.is_initialized():
        _core.init()


def default_devices() -> List[str]:
    """This process's compute device: the GPU ``local_rank % #GPUs`` if TensorFlow sees
    GPUs, else the CPU.  One process per GPU is the hvdlike way to use several GPUs."""
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        return [gpus[_core.local_rank() % len(gpus)].name]
    return ["/device:CPU:0"]


# --------------------------------------------------------------------------- cross-device ops

class MPICrossDeviceOps(tf.distribute.CrossDeviceOps):
    """``tf.distribute.CrossDeviceOps`` that reduces across MPI ranks with hvdlike.

    ``reduce``/``batch_reduce``: sum each value over this process's local replicas, then
    hvdlike allreduce (Sum) over the ranks of ``process_set`` for the values of the call (one
    fused call eagerly; in a compiled step, requests in buckets that overlap backprop: see
    ``gradients.allreduce_gradients``); ``MEAN`` divides by the global number of replicas.
    ``tf.IndexedSlices`` are allgathered (values and indices).  The result is a
    ``Mirrored`` value on ``destinations``.  ``gather`` concatenates the replicas of all
    ranks in global replica order (rank-major).  Every rank must make the same calls in
    the same order, as with any collective.
    """

    def __init__(self, process_set: _core.ProcessSet = global_process_set,
                 compression: Any = Compression.none) -> None:
        super().__init__()
        self._process_set = process_set
        self._compression = compression
        self._calls = 0

    @property
    def _num_between_graph_workers(self):
        # > 1 disables CrossDeviceOps' single-device short-cut, which would skip MPI.
        return self._process_set.size()

    # -- helpers
    def _local_sum(self, per_replica):
        vals = list(per_replica.values)
        if len(vals) == 1:
            return vals[0]
        with tf.device(vals[0].device):
            return _cdu.aggregate_tensors_or_indexed_slices(vals)

    def _mean_scale(self, per_replica):
        return 1.0 / (len(per_replica.values) * self._process_set.size())

    def _mpi_sum(self, tensors, name):
        """Sum a list of dense tensors / IndexedSlices over the ranks."""
        if self._process_set.size() == 1:
            return list(tensors)
        return allreduce_gradients(list(tensors), name, self._process_set, op=Sum,
                                   compression=self._compression)

    @staticmethod
    def _divide(t, scale):
        if isinstance(t, tf.IndexedSlices):
            return tf.IndexedSlices(t.values * tf.cast(scale, t.values.dtype), t.indices,
                                    t.dense_shape)
        if t.dtype.is_floating:
            return t * tf.cast(scale, t.dtype)
        # integers: truncated toward zero, as the core's Average
        return tf.truncatediv(t, tf.cast(round(1.0 / scale), t.dtype))

    # -- CrossDeviceOps implementation hooks
    def reduce_implementation(self, reduce_op: Any, per_replica_value: Any, destinations: Any,
                              options: Any) -> Any:
        return self.batch_reduce_implementation(
            reduce_op, [(per_replica_value, destinations)], options)[0]

    def batch_reduce_implementation(self, reduce_op: Any,
                                    value_destination_pairs: Sequence[Tuple[Any, Any]],
                                    options: Any) -> List[Any]:
        reduce_op = tf.distribute.ReduceOp(reduce_op) if isinstance(reduce_op, str) else reduce_op
        if reduce_op not in (_SUM, _MEAN):
            raise ValueError(f"hvdlike MPIStrategy: reduce_op must be SUM or MEAN (got {reduce_op}).")
        pairs = list(value_destination_pairs)
        if not pairs:
            return []
        local = [self._local_sum(v) for v, _ in pairs]
        self._calls += 1
        reduced = self._mpi_sum(local, name=None)
        out = []
        for (v, dest), r in zip(pairs, reduced):
            if reduce_op == _MEAN:
                r = self._divide(r, self._mean_scale(v))
            out.append(self.broadcast_implementation(r, dest))
        return out

    def _gather_implementation(self, per_replica_value, destinations, axis, options):
        vals = list(per_replica_value.values)
        with tf.device(vals[0].device):
            local = vals[0] if len(vals) == 1 else tf.concat(vals, axis)
            if self._process_set.size() > 1:
                rank = local.shape.rank
                ax = axis % rank if rank else 0
                if ax:
                    perm = [ax] + [i for i in range(rank) if i != ax]
                    local = tf.transpose(local, perm)
                local = gather_ops.allgather(local, process_set=self._process_set)
                if ax:
                    inv = list(np.argsort(perm))
                    local = tf.transpose(local, inv)
        return self.broadcast_implementation(local, destinations)

    def _all_reduce(self, reduce_op, value, replica_id, options):
        # Used only when merge_call is disabled (XLA on GPUs), which hvdlike cannot compile.
        raise NotImplementedError("hvdlike MPIStrategy does not support XLA-compiled steps "
                                  "(jit_compile=True): collectives run on the host.")


# --------------------------------------------------------------------------- cluster resolver

class MPIClusterResolver(tf.distribute.cluster_resolver.ClusterResolver):
    """The MPI world seen as a tf.distribute cluster: one ``worker`` task per rank
    (``task_id`` = rank; rank 0 is the chief, as worker 0 is in MultiWorkerMirroredStrategy).
    ``cluster_spec()`` lists each rank's host (no gRPC servers are started: port 0)."""

    def __init__(self, hosts: Sequence[str], rank: int, num_accelerators: int = 0) -> None:
        self._hosts = list(hosts)
        self.task_type = "worker"
        self.task_id = int(rank)
        self._num_acc = int(num_accelerators)
        self.rpc_layer = None

    def cluster_spec(self) -> tf.train.ClusterSpec:
        return tf.train.ClusterSpec({"worker": [f"{h}:0" for h in self._hosts]})

    def master(self, task_type: Optional[str] = None, task_id: Optional[int] = None,
               rpc_layer: Optional[str] = None) -> str:
        return ""

    def num_accelerators(self, task_type: Optional[str] = None, task_id: Optional[int] = None,
                         config_proto: Any = None) -> Dict[str, int]:
        return {"GPU": self._num_acc} if self._num_acc else {}

    @property
    def environment(self) -> str:
        return ""


# --------------------------------------------------------------------------- extended

class MPIExtended(_mirrored.MirroredExtended):
    """Strategy internals: MirroredExtended over the local devices, MPI across ranks."""

    def __init__(self, container_strategy: Any, devices: Sequence[str],
                 cross_device_ops: MPICrossDeviceOps, process_set: _core.ProcessSet) -> None:
        self._process_set = process_set
        self._ps_rank = process_set.rank()
        self._ps_size = process_set.size()
        super().__init__(container_strategy, devices=devices, cross_device_ops=cross_device_ops)
        self._task_type = "worker"
        self._task_id = self._ps_rank
        self._is_chief = self._ps_rank == 0
        self._num_workers = self._ps_size
        self._id_in_cluster = self._ps_rank
        hosts = _core.allgather_object(socket.gethostname(), process_set=process_set) \
            if self._ps_size > 1 else [socket.gethostname()]
        n_gpu = sum(1 for d in self._devices if "GPU" in d.upper())
        self._cluster_resolver = MPIClusterResolver(hosts, self._ps_rank, n_gpu)

    # -- every reduction goes through MPICrossDeviceOps (MirroredExtended would use a
    #    local-only ReductionToOneDevice for CPU destinations and for int32 values).
    def _get_cross_device_ops(self, value):
        return self._cross_device_ops

    def _reduce_to(self, reduce_op, value, destinations, options):
        # A nested structure (Keras 3 reduces a whole data batch while building the model)
        # is reduced element by element, as MirroredStrategy does; MultiWorkerMirrored-
        # Strategy does not, which is why Keras 3 fit fails with it natively.
        if tf.nest.is_nested(value):
            return tf.nest.map_structure(
                lambda v: self._reduce_to(reduce_op, v, destinations, options), value)
        if _dutils.is_mirrored(value) and reduce_op == _MEAN:
            return value
        if _dutils.is_mirrored(value):
            raise ValueError("hvdlike MPIStrategy: cannot SUM a Mirrored value (it is already "
                             "the same on every replica).")
        if not isinstance(value, _values.DistributedValues) and self._ps_size == 1:
            return _cdo.reduce_non_distributed_value(reduce_op, value, destinations,
                                                     len(self._devices))
        return self._cross_device_ops.reduce(
            reduce_op, value, destinations=destinations,
            options=self._communication_options.merge(options))

    def _batch_reduce_to(self, reduce_op, value_destination_pairs, options):
        return self._cross_device_ops.batch_reduce(
            reduce_op, value_destination_pairs,
            options=self._communication_options.merge(options))

    def _gather_to_implementation(self, value, destinations, axis, options):
        return self._cross_device_ops._gather(  # pylint: disable=protected-access
            value, destinations=destinations, axis=axis, options=options)

    # -- initial values: rank 0's, as MultiWorkerMirroredStrategy broadcasts from the chief
    def _get_variable_creator_initial_value(self, replica_id, device, primary_var, **kwargs):
        if replica_id != 0 or self._ps_size == 1:
            return super()._get_variable_creator_initial_value(
                replica_id=replica_id, device=device, primary_var=primary_var, **kwargs)
        initial_value = kwargs["initial_value"]
        dtype = kwargs.get("dtype", None)
        process_set = self._process_set

        def initial_value_fn():
            value = initial_value() if callable(initial_value) else initial_value
            if isinstance(value, _trackable_base.CheckpointInitialValue):
                return value  # restored from a checkpoint: the same file on every rank
            with tf.device(device):
                value = tf.convert_to_tensor(value, dtype=dtype)
                if value.dtype in bridge.SUPPORTED_DTYPES:  # pylint: disable=protected-access
                    value = gather_ops.broadcast(value, root_rank=0, process_set=process_set)
            return value

        return initial_value_fn

    # -- global replica view
    @property
    def _num_replicas_in_sync(self):
        return len(self._devices) * self._ps_size

    def _get_replica_id_in_sync_group(self, replica_id):
        return self._ps_rank * len(self._devices) + replica_id

    def _get_local_replica_id(self, replica_id_in_sync_group):
        return replica_id_in_sync_group - self._ps_rank * len(self._devices)

    def _in_multi_worker_mode(self):
        return self._ps_size > 1

    @property
    def experimental_between_graph(self):
        return True

    @property
    def should_checkpoint(self):
        return self._is_chief

    @property
    def should_save_summary(self):
        return self._is_chief

    # -- input: each rank reads its shard; the global batch is split over all replicas
    def _make_input_context(self):
        return tf.distribute.InputContext(num_input_pipelines=self._ps_size,
                                          input_pipeline_id=self._ps_rank,
                                          num_replicas_in_sync=self._num_replicas_in_sync)

    def _experimental_distribute_dataset(self, dataset, options):
        if (options and options.experimental_replication_mode
            == tf.distribute.InputReplicationMode.PER_REPLICA):
            raise NotImplementedError("InputReplicationMode.PER_REPLICA is only supported in "
                                      "distribute_datasets_from_function.")
        return _input_util.get_distributed_dataset(
            dataset, self._input_workers_with_options(options), self._container_strategy(),
            num_replicas_in_sync=self._num_replicas_in_sync,
            input_context=self._make_input_context(), options=options)

    def _distribute_datasets_from_function(self, dataset_fn, options):
        if (options and options.experimental_replication_mode
            == tf.distribute.InputReplicationMode.PER_REPLICA):
            raise NotImplementedError("InputReplicationMode.PER_REPLICA is not supported by "
                                      "hvdlike MPIStrategy.")
        return _input_util.get_distributed_datasets_from_function(
            dataset_fn=dataset_fn, input_workers=self._input_workers_with_options(options),
            input_contexts=[self._make_input_context()], strategy=self._container_strategy(),
            options=options)

    def _experimental_distribute_values_from_function(self, value_fn):
        per_replica = []
        for local_id in range(len(self._devices)):
            ctx = tf.distribute.experimental.ValueContext(
                self._get_replica_id_in_sync_group(local_id), self._num_replicas_in_sync)
            per_replica.append(value_fn(ctx))
        return _dutils.regroup(per_replica, always_wrap=True)


# --------------------------------------------------------------------------- strategy

class MPIStrategy(tf.distribute.MultiWorkerMirroredStrategy):
    """Synchronous data parallelism over MPI ranks as a ``tf.distribute.Strategy``.

    Drop-in for ``tf.distribute.MultiWorkerMirroredStrategy`` (and for
    ``MirroredStrategy`` with one process per GPU) under ``mpirun``/``srun``/``hvdlikerun``.
    Every rank creates it (it calls ``hvdlike.init()`` if needed) with the same arguments.

    ``devices``: this process's devices (default: ``default_devices``, one GPU by
    local rank, or the CPU).  ``process_set``: the ranks taking part (default: all).
    ``compression``: ``hvdlike.tensorflow.Compression`` applied to reductions.

    Works with ``strategy.scope()``, Keras 3 (and tf_keras) ``compile``/``fit``/
    ``evaluate``/``predict``, ``strategy.run``/``reduce``/``gather``,
    ``experimental_distribute_dataset`` (each rank keeps its shard of every global batch)
    and ``distribute_datasets_from_function`` (``input_context.input_pipeline_id`` = rank).
    ``num_replicas_in_sync`` is the global replica count.  At size 1 it behaves like
    ``OneDeviceStrategy``/the default strategy.
    """

    def __init__(self, devices: Optional[Sequence[str]] = None,
                 process_set: _core.ProcessSet = global_process_set,
                 compression: Any = Compression.none) -> None:
        _ensure_init()
        devices = list(devices) if devices else default_devices()
        cross_ops = MPICrossDeviceOps(process_set=process_set, compression=compression)
        extended = MPIExtended(self, devices=devices, cross_device_ops=cross_ops,
                               process_set=process_set)
        # Not MultiWorkerMirroredStrategy.__init__: that would start TF's gRPC collectives.
        tf.distribute.Strategy.__init__(self, extended)

    def reduce(self, reduce_op: Union[str, tf.distribute.ReduceOp], value: Any,
               axis: Optional[int]) -> Any:
        """``tf.distribute.Strategy.reduce`` across all replicas of all ranks.  A scalar
        value with ``axis=0`` (what Keras 3 asks for its per-step logs) is reduced as a
        scalar."""
        if axis is not None:
            shapes = [getattr(v, "shape", None) for v in
                      tf.nest.flatten(self.experimental_local_results(value))]
            if shapes and all(s is not None and s.rank == 0 for s in shapes):
                axis = None
        return super().reduce(reduce_op, value, axis)

    @property
    def cluster_resolver(self) -> MPIClusterResolver:
        """An ``MPIClusterResolver`` (``task_type`` "worker", ``task_id`` = rank)."""
        return self.extended._cluster_resolver  # pylint: disable=protected-access

    def __deepcopy__(self, memo: Dict[int, Any]) -> "MPIStrategy":
        # Keras may deep-copy objects holding the strategy; there is one per process.
        memo[id(self)] = self
        return self

