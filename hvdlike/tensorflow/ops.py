"""Reductions on TensorFlow values, with gradients: allreduce (dense, grouped, sparse) and
reducescatter. How a collective on TensorFlow values runs, eager and in a graph, and how its
errors surface: ``.bridge``; the collectives without gradients they are built from:
``.primitives``.
"""
from typing import Any, List, Optional, Sequence

import tensorflow as tf

import hvdlike as _core
from hvdlike import Average, ProcessSet, ReduceOp, Sum, global_process_set
from hvdlike.base.reduce_ops import as_reduce_op
from hvdlike.base.tracebacks import short
from hvdlike.submission import listed as _listed
from hvdlike.tensorflow import bridge, compat, gather_ops, primitives
from hvdlike.tensorflow.compression import Compression, check_compression

# --------------------------------------------------------------------------- allreduce


def _allreduce_grad_op(op, what):
    if op not in (Average, Sum):
        raise NotImplementedError(
            f"hvdlike.tensorflow.{what}: the gradient is defined only for op=Average and "
            f"op=Sum (got {ReduceOp(op).name}); stop the gradient with tf.stop_gradient.")
    return op


def _grouped_allreduce_with_grad(tensors, op, prescale_factor, postscale_factor, name,
                                 process_set):
    differentiable = any(t.dtype.is_floating for t in tensors)
    if not differentiable or (tf.executing_eagerly() and not compat.tape_may_record()):
        return primitives.allreduce_raw(tensors, op, prescale_factor, postscale_factor, name,
                                        process_set)

    @tf.custom_gradient
    def fwd(*xs):
        ys = primitives.allreduce_raw(list(xs), op, prescale_factor, postscale_factor, name,
                                      process_set)

        def grad(*dys):
            _allreduce_grad_op(op, "allreduce")
            dys = [tf.zeros_like(y) if d is None else tf.convert_to_tensor(d)
                   for d, y in zip(dys, ys)]
            return primitives.allreduce_raw(dys, op, prescale_factor, postscale_factor,
                                            None if name is None else name + "/grad", process_set)
        return ys, grad

    return list(fwd(*tensors))


def _allreduce_sparse(slices, op, prescale_factor, postscale_factor, compression, name,
                      process_set):
    """Reduce tf.IndexedSlices by gathering values and indices from every rank."""
    if op not in (Average, Sum):
        raise NotImplementedError(
            "hvdlike.tensorflow.allreduce: tf.IndexedSlices support only op=Average or op=Sum "
            f"(got {ReduceOp(op).name}); pass sparse_as_dense=True to reduce them as dense "
            "tensors.")
    values, ctx = compression.compress(slices.values)
    scale = prescale_factor * postscale_factor
    if op == Average:
        scale = scale / bridge.ps_size(process_set)
    values = gather_ops.allgather(values, name=None if name is None else name + "/values",
                                  process_set=process_set)
    indices = gather_ops.allgather(slices.indices, name=None if name is None else name + "/indices",
                                   process_set=process_set)
    values = compression.decompress(values, ctx)
    if values.dtype.is_integer and (op == Average or scale != 1.0):
        # As in Horovod (true division): averaged or scaled integer values become floating.
        values = tf.cast(values, tf.float32 if values.dtype.size <= 2 else tf.float64)
    if scale != 1.0:
        values = values * tf.cast(scale, values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


@short
def allreduce(tensor: Any, average: Optional[bool] = None, device_dense: str = "",
              device_sparse: str = "", compression: Any = Compression.none,
              op: Optional[Any] = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set, ignore_name_scope: bool = False,
              sparse_as_dense: bool = False) -> Any:
    """Reduce ``tensor`` across the ranks of ``process_set``.

    Every rank passes a tensor of the same dtype and shape and the same ``op``
    (Average by default, or Sum/Min/Max/Product/Adasum); every rank gets back the reduced
    tensor (same dtype and static shape).  ``tf.IndexedSlices`` are reduced by
    allgathering values and indices (Average divides the values by the number of
    ranks, integers becoming floating as in Horovod) unless ``sparse_as_dense=True``.
    Works eagerly and inside ``tf.function``; the gradient is the allreduce of the incoming
    gradient with the same op.
    ``device_dense``/``device_sparse``/``ignore_name_scope`` are accepted for Horovod
    compatibility and ignored.
    """
    op = bridge.normalize_op(op, average, "allreduce")
    check_compression(compression, "hvdlike.tensorflow.allreduce")
    if isinstance(tensor, tf.IndexedSlices):
        if sparse_as_dense:
            tensor = tf.convert_to_tensor(tensor)
        else:
            return _allreduce_sparse(tensor, op, prescale_factor, postscale_factor,
                                     compression, name, process_set)
    tensor = bridge.to_tensor(tensor, "allreduce", name)
    compressed, ctx = compression.compress(tensor)
    out = _grouped_allreduce_with_grad([compressed], op, prescale_factor, postscale_factor,
                                       name, process_set)[0]
    return compression.decompress(out, ctx)


@short
def grouped_allreduce(tensors: Sequence[Any], average: Optional[bool] = None,
                      device_dense: str = "", device_sparse: str = "",
                      compression: Any = Compression.none, op: Optional[Any] = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      name: Optional[str] = None, process_set: ProcessSet = global_process_set,
                      sparse_as_dense: bool = False) -> List[Any]:
    """Allreduce a list of tensors in one fused operation; returns a list.

    Same contract as ``allreduce``, element by element: every rank passes the
    same number of tensors with matching dtypes and shapes.
    """
    op = bridge.normalize_op(op, average, "grouped_allreduce")
    check_compression(compression, "hvdlike.tensorflow.grouped_allreduce")
    tensors = _listed(tensors, "hvdlike.tensorflow.grouped_allreduce")
    out = [None] * len(tensors)
    dense_idx, dense, ctxs = [], [], []
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices) and not sparse_as_dense:
            out[i] = _allreduce_sparse(t, op, prescale_factor, postscale_factor, compression,
                                       None if name is None else f"{name}/{i}", process_set)
            continue
        if isinstance(t, tf.IndexedSlices):
            t = tf.convert_to_tensor(t)
        t = bridge.to_tensor(t, "grouped_allreduce", name)
        c, ctx = compression.compress(t)
        dense_idx.append(i)
        dense.append(c)
        ctxs.append(ctx)
    if dense:
        reduced = _grouped_allreduce_with_grad(dense, op, prescale_factor, postscale_factor,
                                               name, process_set)
        for i, r, ctx in zip(dense_idx, reduced, ctxs):
            out[i] = compression.decompress(r, ctx)
    return out


# --------------------------------------------------------------------------- reducescatter

def _scattered_shape(shape, process_set):
    if shape.rank is None or shape.rank == 0 or shape[0] is None:
        return tf.TensorShape([None] + shape.as_list()[1:]) if shape.rank else shape
    n, r, d0 = bridge.ps_size(process_set), bridge.ps_rank(process_set), shape[0]
    return tf.TensorShape([d0 // n + (1 if r < d0 % n else 0)] + shape.as_list()[1:])


def _reducescatter_raw(tensors, op, prescale_factor, postscale_factor, name, process_set):
    def submit(op_name, *arrays):
        kw = dict(op=op, name=name or op_name, process_set=process_set,
                  prescale_factor=prescale_factor, postscale_factor=postscale_factor)
        if len(arrays) == 1:
            return bridge.one(_core.reducescatter_async(arrays[0], **kw))
        return bridge.many(_core.grouped_reducescatter_async(list(arrays), **kw))
    return bridge.run("reducescatter", submit, tensors, [t.dtype for t in tensors],
                      [_scattered_shape(t.shape, process_set) for t in tensors], process_set, name)


def _grouped_reducescatter_with_grad(tensors, op, prescale_factor, postscale_factor, name,
                                     process_set):
    @tf.custom_gradient
    def fwd(*xs):
        ys = _reducescatter_raw(list(xs), op, prescale_factor, postscale_factor, name,
                                process_set)

        def grad(*dys):
            _allreduce_grad_op(op, "reducescatter")
            dys = [tf.zeros_like(y) if d is None else tf.convert_to_tensor(d)
                   for d, y in zip(dys, ys)]
            gs = primitives.allgather_raw(dys, None if name is None else name + "/grad",
                                          process_set)
            scale = prescale_factor * postscale_factor
            if op == Sum:  # Horovod's rule: Sum's gradient is the allgather times the set size
                scale = scale * bridge.ps_size(process_set)
            return [g if scale == 1.0 else g * tf.cast(scale, g.dtype) for g in gs]
        return ys, grad

    for t in tensors:
        if t.shape.rank == 0:
            raise ValueError("hvdlike.tensorflow.reducescatter: scalars cannot be scattered "
                             "along axis 0; reshape to [1] first.")
    if not any(t.dtype.is_floating for t in tensors):
        return _reducescatter_raw(tensors, op, prescale_factor, postscale_factor, name,
                                  process_set)
    return list(fwd(*tensors))


@short
def reducescatter(tensor: Any, device_dense: str = "", compression: Any = Compression.none,
                  op: Any = Average, name: Optional[str] = None,
                  process_set: ProcessSet = global_process_set,
                  ignore_name_scope: bool = False, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduce ``tensor`` over ranks and give each rank one block of axis 0.

    Every rank passes the same dtype/shape/op.  With first dimension d0 and n ranks,
    rank r gets ``d0 // n`` rows, plus one if ``r < d0 % n`` (rank order).
    """
    check_compression(compression, "hvdlike.tensorflow.reducescatter")
    tensor = bridge.to_tensor(tensor, "reducescatter", name)
    c, ctx = compression.compress(tensor)
    out = _grouped_reducescatter_with_grad([c], as_reduce_op(op), prescale_factor,
                                           postscale_factor, name, process_set)[0]
    return compression.decompress(out, ctx)


@short
def grouped_reducescatter(tensors: Sequence[Any], device_dense: str = "",
                          compression: Any = Compression.none, op: Any = Average,
                          name: Optional[str] = None,
                          process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> List[tf.Tensor]:
    """Reducescatter a list of tensors in one call (see ``reducescatter``)."""
    check_compression(compression, "hvdlike.tensorflow.grouped_reducescatter")
    tensors = [bridge.to_tensor(t, "grouped_reducescatter", name)
               for t in _listed(tensors, "hvdlike.tensorflow.grouped_reducescatter")]
    if not tensors:
        return []
    pairs = [compression.compress(t) for t in tensors]
    outs = _grouped_reducescatter_with_grad([p[0] for p in pairs], as_reduce_op(op),
                                            prescale_factor, postscale_factor, name,
                                            process_set)
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


