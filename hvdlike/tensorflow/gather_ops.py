"""Collectives that move rows of TensorFlow values, with gradients: allgather (and grouped),
broadcast, alltoall. How they run, eager and in a graph: ``.bridge``.
"""
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

import hvdlike as _core
from hvdlike import Average, ProcessSet, global_process_set
from hvdlike.base.tracebacks import short
from hvdlike.submission import listed as _listed
from hvdlike.tensorflow import bridge, primitives

# --------------------------------------------------------------------------- allgather


def _allgather_grad(x, dy, name, process_set):
    """Gradient of allgather: average the gradient over ranks (as Horovod does), keep this
    rank's rows."""
    dy = primitives.allreduce_raw([tf.convert_to_tensor(dy)], Average, 1.0, 1.0,
                                  None if name is None else name + "/grad", process_set)[0]
    d0 = tf.reshape(tf.shape(x, out_type=tf.int64)[0], [1])
    sizes = primitives.allgather_raw([d0], None if name is None else name + "/grad_sizes",
                                     process_set)[0]
    r = bridge.ps_rank(process_set)
    start = tf.reduce_sum(sizes[:r])
    return dy[start:start + sizes[r]]


def _grouped_allgather_with_grad(tensors, name, process_set):
    @tf.custom_gradient
    def fwd(*xs):
        ys = primitives.allgather_raw(list(xs), name, process_set)

        def grad(*dys):
            return [_allgather_grad(x, tf.zeros_like(y) if d is None else d, name, process_set)
                    for x, y, d in zip(xs, ys, dys)]
        return ys, grad

    for t in tensors:
        if t.shape.rank == 0:
            raise ValueError("hvdlike.tensorflow.allgather: scalars cannot be gathered "
                             "along axis 0; reshape to [1] first (tf.reshape(x, [1])).")
    if not any(t.dtype.is_floating for t in tensors):
        return primitives.allgather_raw(tensors, name, process_set)
    return list(fwd(*tensors))


@short
def allgather(tensor: Any, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set,
              ignore_name_scope: bool = False) -> tf.Tensor:
    """Concatenate ``tensor`` from every rank along axis 0 (in rank order).

    Every rank passes a tensor with the same dtype and the same shape except the
    first dimension, which may differ; every rank gets the concatenation.  The
    gradient averages the incoming gradient over ranks and returns this rank's rows.
    """
    tensor = bridge.to_tensor(tensor, "allgather", name)
    return _grouped_allgather_with_grad([tensor], name, process_set)[0]


@short
def grouped_allgather(tensors: Sequence[Any], name: Optional[str] = None,
                      process_set: ProcessSet = global_process_set) -> List[tf.Tensor]:
    """Allgather a list of tensors in one call; returns a list (see ``allgather``)."""
    tensors = [bridge.to_tensor(t, "grouped_allgather", name)
               for t in _listed(tensors, "hvdlike.tensorflow.grouped_allgather")]
    if not tensors:
        return []
    return _grouped_allgather_with_grad(tensors, name, process_set)


# --------------------------------------------------------------------------- broadcast

def _broadcast_raw(tensor, root_rank, name, process_set):
    def submit(op_name, a):
        return bridge.one(_core.broadcast_async(a, root_rank, name=name or op_name,
                                                process_set=process_set))
    return bridge.run("broadcast", submit, [tensor], [tensor.dtype], [tensor.shape], process_set,
                      name)[0]


@short
def broadcast(tensor: Any, root_rank: int, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set,
              ignore_name_scope: bool = False) -> tf.Tensor:
    """Return ``root_rank``'s value of ``tensor`` on every rank.

    Every rank passes a tensor of the same dtype and shape and the same root.  The
    gradient is the average of the incoming gradients on the root and zero elsewhere.
    """
    tensor = bridge.to_tensor(tensor, "broadcast", name)

    @tf.custom_gradient
    def fwd(x):
        y = _broadcast_raw(x, root_rank, name, process_set)

        def grad(dy):
            g = primitives.allreduce_raw([tf.convert_to_tensor(dy)], Average, 1.0, 1.0,
                                         None if name is None else name + "/grad", process_set)[0]
            if _core.rank() == root_rank:  # world ranks, as Horovod compares them
                return g
            with tf.control_dependencies([g]):  # in a graph the all-reduce must still run
                return tf.zeros_like(g)
        return y, grad

    if not tensor.dtype.is_floating:
        return _broadcast_raw(tensor, root_rank, name, process_set)
    return fwd(tensor)


# --------------------------------------------------------------------------- alltoall

def _alltoall_raw(tensor, splits, name, process_set):
    n = bridge.ps_size(process_set)

    def submit(op_name, a, s=None):
        handle = _core.alltoall_async(a, splits=s, name=name or op_name,
                                      process_set=process_set)

        def wait():
            out, received = handle.synchronize()
            return [out, np.asarray(received, dtype=np.int64)]
        return bridge.Wait([handle], wait)
    shape = tensor.shape
    out_shape = (tf.TensorShape([None] + shape.as_list()[1:]) if shape.rank
                 else tf.TensorShape(None))
    inputs = [tensor] if splits is None else [tensor, splits]
    return bridge.run("alltoall", submit, inputs, [tensor.dtype, tf.int64],
                      [out_shape, tf.TensorShape([n])], process_set, name)


@short
def alltoall(tensor: Any, splits: Optional[Any] = None, name: Optional[str] = None,
             process_set: ProcessSet = global_process_set,
             ignore_name_scope: bool = False) -> Union[tf.Tensor, Tuple[tf.Tensor, tf.Tensor]]:
    """Send rows ``splits[i]`` of ``tensor`` (axis 0) to rank i; receive from all.

    Without ``splits`` the first dimension must be divisible by the number of ranks
    and is split evenly.  Returns the received rows; with ``splits`` given,
    ``(received, received_splits)`` (Horovod's rule).  The gradient sends the incoming
    gradient back with ``received_splits``.
    """
    tensor = bridge.to_tensor(tensor, "alltoall", name)
    if splits is not None:
        splits = tf.cast(tf.convert_to_tensor(splits), tf.int64)

    @tf.custom_gradient
    def fwd(x):
        y, received = _alltoall_raw(x, splits, name, process_set)

        def grad(dy, _dsplits=None):
            g, _ = _alltoall_raw(tf.convert_to_tensor(dy), received,
                                 None if name is None else name + "/grad", process_set)
            return g
        return (y, received), grad

    if not tensor.dtype.is_floating:
        y, received = _alltoall_raw(tensor, splits, name, process_set)
    else:
        y, received = fwd(tensor)
    return y if splits is None else (y, received)


