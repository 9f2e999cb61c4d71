"""Collectives on TensorFlow values, with gradients.

Every collective has ONE implementation: a function on NumPy arrays that submits a request
to the hvdlike engine and returns how to wait for it.  Eager mode calls it and waits at once;
in a graph (``tf.function``, as Keras ``fit`` compiles its train step, or a v1 graph) it is
a submit op and a wait op (see :func:`_run`).  Shapes are set statically on the graph
outputs wherever they are known.

Requests pair across ranks by name (an explicit ``name=``, or in a graph the op's name;
unnamed eager calls pair in call order), in whatever order each rank runs them; a name
with mismatched metadata (dtype, shape, op, root, splits) raises
``tf.errors.FailedPreconditionError`` on every rank, as Horovod does (the message names the
ranks and their values; the NumPy API raises ``hvdlike.CollectiveMismatchError``). In a
``tf.function``, TensorFlow reports that error, raised inside a Python function op, as
``UnknownError``; its message keeps ours, prefixed ``FailedPreconditionError``. A bad value
on any rank raises ``tf.errors.InvalidArgumentError`` on every rank
(:class:`CollectiveInputError`), eager and in a graph.  A v1 graph's wait ops (the
``HvdlikeWait`` kernel) keep both classes.
"""
import itertools
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

import hvdlike as _core
from hvdlike import Average, Max, Min, ProcessSet, Product, ReduceOp, Sum, global_process_set  # noqa: F401
from hvdlike import process_sets as _process_sets
from hvdlike import runtime as _runtime
from hvdlike.base.reduce_ops import as_reduce_op
from hvdlike.collectives import listed as _listed
from hvdlike.collectives import packed_allreduce_async, require_name
from hvdlike.engine import timeline as _timeline
from hvdlike.tensorflow import compat, devices, wait_kernel
from hvdlike.tensorflow.compression import Compression, check_compression
from hvdlike.tensorflow.packing import Packing

_SUPPORTED_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int8, tf.int16,
                     tf.int32, tf.int64, tf.uint8, tf.uint16, tf.uint32, tf.uint64, tf.bool)


# --------------------------------------------------------------------------- helpers

def _label(tensor, name):
    if name:
        return repr(name)
    try:
        return repr(tensor.name)
    except (AttributeError, ValueError):
        return f"of shape {tensor.shape.as_list() if tensor.shape.rank is not None else '?'}"


def _to_tensor(value, what, name):
    """Accept tf.Tensor / tf.Variable / NumPy / Python values; reject strings & co."""
    if isinstance(value, tf.IndexedSlices):
        raise TypeError(f"hvdlike.tensorflow.{what}: tf.IndexedSlices is only supported by "
                        "allreduce (and the gradient tape / optimizer); convert it with "
                        "tf.convert_to_tensor(x) first.")
    t = tf.convert_to_tensor(value)
    if t.dtype not in _SUPPORTED_DTYPES:
        supported = ", ".join(d.name for d in _SUPPORTED_DTYPES)
        hint = ("use hvdlike.tensorflow.broadcast_object / allgather_object for strings and "
                "other Python objects" if t.dtype == tf.string
                else "cast it first, e.g. tf.cast(x, tf.float32)")
        raise TypeError(f"hvdlike.tensorflow.{what}: tensor {_label(t, name)} on rank "
                        f"{_safe_rank()} has dtype {t.dtype.name}, which hvdlike cannot "
                        f"communicate (supported: {supported}); {hint}.")
    return t


def _safe_rank():
    try:
        return _core.rank()
    except Exception:
        return "?"


def _check_not_xla(what):
    if compat.in_xla_context():
        raise RuntimeError(
            f"hvdlike.tensorflow.{what} was called inside an XLA-compiled function "
            "(jit_compile=True). hvdlike collectives run on the host through "
            "tf.numpy_function, which XLA cannot compile. Use jit_compile=False: "
            "model.compile(..., jit_compile=False) for Keras, or "
            "tf.function(fn, jit_compile=False) for custom loops.")


def _ps_size(process_set):
    return process_set.size()


def _ps_rank(process_set):
    return process_set.rank()


_PENDING = {}  # key -> wait function (_Wait) of a request submitted by a graph op
_KEYS = itertools.count()


def mismatch_error(message: str) -> tf.errors.FailedPreconditionError:
    """What the TensorFlow API raises when ranks disagree on a collective (Horovod's class)."""
    return tf.errors.FailedPreconditionError(None, None, message)


class CollectiveInputError(tf.errors.InvalidArgumentError, ValueError):
    """A collective's input was bad on some rank (e.g. alltoall splits that do not sum to the
    first dimension), raised on every rank: ``tf.errors.InvalidArgumentError`` as in Horovod
    and as TensorFlow reports the same error from a graph, and a ``ValueError`` as hvdlike's
    NumPy API raises it."""

    def __init__(self, *args: Any) -> None:
        # (message), or TensorFlow's (node_def, op, message[, error_code]): Keras re-creates
        # an error raised in a layer's call that way, to add the layer to its message
        node_def, op, message = (None, None, args[0]) if len(args) == 1 else args[:3]
        super().__init__(node_def, op, message)


def _outputs(wait):
    """Call a submit's wait function. A disagreement between ranks becomes
    ``tf.errors.FailedPreconditionError`` (in a graph TensorFlow wraps it in UnknownError);
    bad input (a ``ValueError`` on every rank) or a process set this rank cannot use becomes
    :class:`CollectiveInputError` (in a graph TensorFlow turns it into
    ``InvalidArgumentError`` itself), as in Horovod."""
    try:
        return wait()
    except _core.CollectiveMismatchError as exc:
        raise _same_quiet(mismatch_error(str(exc)), exc) from exc
    except _core.NotInitializedError:
        raise  # as it is: Horovod raises a ValueError there too
    except ValueError as exc:
        raise _same_quiet(CollectiveInputError(str(exc)), exc) from exc


def _same_quiet(error, original):
    """``error``, marked to be printed only where ``original`` would be (see
    ``hvdlike.engine.checks.raised_on_every_rank``)."""
    error.hvdlike_quiet = getattr(original, "hvdlike_quiet", False)
    return error


def _run(what, submit, inputs, out_dtypes, out_shapes, process_set=None, name=None):
    """Run a collective on TF tensors: ``submit(op_name, *numpy_inputs)`` hands the request
    to the engine and returns a function that waits and returns the outputs (a list).

    Eager: submit and wait at once (``op_name`` None: an unnamed request pairs in call order).
    Graph: a submit op and a wait op (:func:`_submit_op`, :func:`_wait_op`); a
    ``process_set`` that is not registered raises ``ValueError`` here, as in Horovod. A
    ``name`` that is not a string raises ``TypeError`` here (in a graph: when traced).
    """
    if tf.executing_eagerly():
        require_name(name, f"hvdlike.tensorflow.{what}")
        arrays = [devices.to_core(t) for t in inputs]
        outs = _outputs(lambda: submit(None, *arrays)())  # errors at submit converted too
        return [devices.from_core(o, d) for o, d in zip(outs, out_dtypes)]
    _check_graph_request(what, name, process_set)
    return _wait_op(what, [_submit_op(what, submit, inputs)], out_dtypes, out_shapes)


def _check_graph_request(what, name, process_set):
    """What a graph collective checks when traced: its ``name`` and ``process_set``."""
    require_name(name, f"hvdlike.tensorflow.{what}")
    if process_set is not None and process_set is not global_process_set:
        _process_sets.require_registered(process_set, f"hvdlike.tensorflow.{what}")


def _op_base_name(what):
    return "Hvdlike" + "".join(p.title() for p in what.split("_"))


def _submit_op(what, submit, inputs):
    """Graph: a stateful op that submits the request and returns its key at once.  Its own
    graph op name is the request's name when none was given: the same on every rank that
    built the same graph, so unnamed collectives pair up by name, as Horovod's ops do.
    Under ``tf.function`` automatic control dependencies chain stateful ops in program
    order, so submits keep that order and each runs as soon as its inputs exist."""
    _check_not_xla(what)
    op_name = []  # set once the op exists

    def _submit_fn(*arrays):
        # the arrays keep TF's input buffers alive (and unwritten) until the engine is done
        key = next(_KEYS)
        _PENDING[key] = submit(op_name[0], *arrays)
        return np.int64(key)

    key = tf.numpy_function(_submit_fn, list(inputs), tf.int64, stateful=True,
                            name=_op_base_name(what))
    op_name.append(key.op.name)
    return key


def _wait_op(what, keys, out_dtypes, out_shapes):
    """Graph: one stateless op that waits for the requests behind ``keys`` and returns their
    outputs, in order.  Not chained to anything: ranks that build independent collectives in
    different orders submit all of them before any wait blocks.  In a tf.compat.v1 graph
    (its ``tf.cond`` branches included) it is the asynchronous ``HvdlikeWait`` kernel
    (:mod:`.wait_kernel`), which holds no TensorFlow thread while it waits; in a
    ``tf.function`` (whose submits run in program order) and where that kernel is missing,
    a ``tf.numpy_function``."""
    name = _op_base_name(what) + "Wait"
    kernel = None
    if not tf.compat.v1.executing_eagerly_outside_functions() and _wait_kernel_enabled():
        kernel = wait_kernel.get(_PENDING.pop, _outputs)
    if kernel is not None:
        outs = kernel.op(keys, out_dtypes, name)
    else:
        def _wait_fn(*ks):
            outs = [o for k in ks for o in _outputs(_PENDING.pop(int(k)))]
            return [np.asarray(o, dtype=d.as_numpy_dtype) for o, d in zip(outs, out_dtypes)]

        outs = tf.numpy_function(_wait_fn, list(keys), list(out_dtypes), stateful=False,
                                 name=name)
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    for o, s in zip(outs, out_shapes):
        o.set_shape(s)
    return outs


def _wait_kernel_enabled():
    return _runtime.state("hvdlike.tensorflow collectives").settings.tf_wait_kernel


class Submitted(NamedTuple):
    """A graph all-reduce handed to the engine: its submit op's key, and how its tensors
    cross (:class:`~hvdlike.tensorflow.packing.Packing`)."""

    key: tf.Tensor
    packing: Packing
    crossing: List[tf.Tensor]


def allreduce_submit(tensors: Sequence[tf.Tensor], op: Any, prescale_factor: float,
                     postscale_factor: float, name: Optional[str],
                     process_set: _core.ProcessSet) -> Submitted:
    """Graph only: the submit half of an allreduce of dense tensors (one request; grouped when
    there are several), for :func:`allreduce_wait`."""
    packing = Packing(tensors, op)
    crossing = packing.pack(tensors)
    submit = _allreduce_submit(op, prescale_factor, postscale_factor, name, process_set,
                               packing.parts)
    return Submitted(_submit_op("allreduce", submit, crossing), packing, crossing)


def allreduce_wait(submitted: Sequence[Submitted]) -> List[tf.Tensor]:
    """Graph only: one op that waits for the allreduces ``submitted`` (from
    :func:`allreduce_submit`); returns their results, one request after the other."""
    crossing = [c for s in submitted for c in s.crossing]
    outs = _wait_op("allreduce", [s.key for s in submitted], [c.dtype for c in crossing],
                    [c.shape for c in crossing])
    results, at = [], 0
    for s in submitted:
        results += s.packing.unpack(outs[at:at + len(s.crossing)])
        at += len(s.crossing)
    return results


class _Wait:
    """A submitted request's wait function: ``handles``, the engine requests it waits for,
    and calling it waits for them and returns the outputs (a list)."""

    __slots__ = ("handles", "outputs")

    def __init__(self, handles, outputs):
        self.handles, self.outputs = handles, outputs

    def __call__(self):
        return self.outputs()


def _done(*outs):
    """A submit's wait function for outputs that are already there."""
    return _Wait([], lambda: list(outs))


def _one(handle):
    """A submit's wait function for a handle whose result is one array."""
    return _Wait([handle], lambda: [handle.synchronize()])


def _many(handle):
    """A submit's wait function for a handle whose result is a list or tuple of arrays."""
    return _Wait([handle], lambda: list(handle.synchronize()))


def _normalize_op(op, average, what):
    if average is not None:
        if op is not None:
            raise ValueError(f"hvdlike.tensorflow.{what}: pass either op= or the deprecated "
                             "average=, not both.")
        return Average if average else Sum
    return Average if op is None else as_reduce_op(op)


# --------------------------------------------------------------------------- allreduce

def _allreduce_submit(op, prescale_factor, postscale_factor, name, process_set, parts=None):
    """The submit function of an all-reduce; with ``parts`` (``Packing.parts``), of tensors
    crossing packed (the engine reduces them packed, one result per crossing tensor)."""
    def submit(op_name, *arrays):
        kw = dict(op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                  name=name or op_name, process_set=process_set)
        if parts is not None:
            return _many(packed_allreduce_async(arrays, parts, **kw))
        if len(arrays) == 1:
            return _one(_core.allreduce_async(arrays[0], **kw))
        return _many(_core.grouped_allreduce_async(list(arrays), **kw))
    return submit


def _allreduce_raw(tensors, op, prescale_factor, postscale_factor, name, process_set):
    """Allreduce a list of dense tensors in ONE fused core call (in a graph, the small ones
    cross packed: :mod:`hvdlike.tensorflow.packing`)."""
    if not tensors:
        return []
    if tf.executing_eagerly():
        submit = _allreduce_submit(op, prescale_factor, postscale_factor, name, process_set)
        return _run("allreduce", submit, tensors, [t.dtype for t in tensors],
                    [t.shape for t in tensors], process_set, name)
    _check_graph_request("allreduce", name, process_set)
    return allreduce_wait([allreduce_submit(tensors, op, prescale_factor, postscale_factor,
                                            name, process_set)])


def _allreduce_grad_op(op, what):
    if op not in (Average, Sum):
        raise NotImplementedError(
            f"hvdlike.tensorflow.{what}: the gradient is defined only for op=Average and "
            f"op=Sum (got {ReduceOp(op).name}); stop the gradient with tf.stop_gradient.")
    return op


def _grouped_allreduce_with_grad(tensors, op, prescale_factor, postscale_factor, name,
                                 process_set):
    @tf.custom_gradient
    def fwd(*xs):
        ys = _allreduce_raw(list(xs), op, prescale_factor, postscale_factor, name, process_set)

        def grad(*dys):
            _allreduce_grad_op(op, "allreduce")
            dys = [tf.zeros_like(y) if d is None else tf.convert_to_tensor(d)
                   for d, y in zip(dys, ys)]
            return _allreduce_raw(dys, op, prescale_factor, postscale_factor,
                                  None if name is None else name + "/grad", process_set)
        return ys, grad

    differentiable = any(t.dtype.is_floating for t in tensors)
    if not differentiable:
        return _allreduce_raw(tensors, op, prescale_factor, postscale_factor, name, process_set)
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
        scale = scale / _ps_size(process_set)
    values = allgather(values, name=None if name is None else name + "/values",
                       process_set=process_set)
    indices = allgather(slices.indices, name=None if name is None else name + "/indices",
                        process_set=process_set)
    values = compression.decompress(values, ctx)
    if values.dtype.is_integer and (op == Average or scale != 1.0):
        # As in Horovod (true division): averaged or scaled integer values become floating.
        values = tf.cast(values, tf.float32 if values.dtype.size <= 2 else tf.float64)
    if scale != 1.0:
        values = values * tf.cast(scale, values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


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
    op = _normalize_op(op, average, "allreduce")
    check_compression(compression, "hvdlike.tensorflow.allreduce")
    if isinstance(tensor, tf.IndexedSlices):
        if sparse_as_dense:
            tensor = tf.convert_to_tensor(tensor)
        else:
            return _allreduce_sparse(tensor, op, prescale_factor, postscale_factor,
                                     compression, name, process_set)
    tensor = _to_tensor(tensor, "allreduce", name)
    compressed, ctx = compression.compress(tensor)
    out = _grouped_allreduce_with_grad([compressed], op, prescale_factor, postscale_factor,
                                       name, process_set)[0]
    return compression.decompress(out, ctx)


def grouped_allreduce(tensors: Sequence[Any], average: Optional[bool] = None,
                      device_dense: str = "", device_sparse: str = "",
                      compression: Any = Compression.none, op: Optional[Any] = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      name: Optional[str] = None, process_set: ProcessSet = global_process_set,
                      sparse_as_dense: bool = False) -> List[Any]:
    """Allreduce a list of tensors in one fused operation; returns a list.

    Same contract as :func:`allreduce`, element by element: every rank passes the
    same number of tensors with matching dtypes and shapes.
    """
    op = _normalize_op(op, average, "grouped_allreduce")
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
        t = _to_tensor(t, "grouped_allreduce", name)
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


# --------------------------------------------------------------------------- allgather

def _gathered_shape(shape, process_set):
    if shape.rank is None:
        return tf.TensorShape(None)
    dims = shape.as_list()
    first = dims[0] if (_ps_size(process_set) == 1 and dims) else None
    return tf.TensorShape([first] + dims[1:]) if dims else tf.TensorShape(None)


def _allgather_raw(tensors, name, process_set):
    def submit(op_name, *arrays):
        if len(arrays) == 1:
            return _one(_core.allgather_async(arrays[0], name=name or op_name,
                                              process_set=process_set))
        return _many(_core.grouped_allgather_async(list(arrays), name=name or op_name,
                                                   process_set=process_set))
    return _run("allgather", submit, tensors, [t.dtype for t in tensors],
                [_gathered_shape(t.shape, process_set) for t in tensors], process_set, name)


def _allgather_grad(x, dy, name, process_set):
    """Gradient of allgather: average the gradient over ranks (as Horovod does), keep this
    rank's rows."""
    dy = _allreduce_raw([tf.convert_to_tensor(dy)], Average, 1.0, 1.0,
                        None if name is None else name + "/grad", process_set)[0]
    d0 = tf.reshape(tf.shape(x, out_type=tf.int64)[0], [1])
    sizes = _allgather_raw([d0], None if name is None else name + "/grad_sizes",
                           process_set)[0]
    r = _ps_rank(process_set)
    start = tf.reduce_sum(sizes[:r])
    return dy[start:start + sizes[r]]


def _grouped_allgather_with_grad(tensors, name, process_set):
    @tf.custom_gradient
    def fwd(*xs):
        ys = _allgather_raw(list(xs), name, process_set)

        def grad(*dys):
            return [_allgather_grad(x, tf.zeros_like(y) if d is None else d, name, process_set)
                    for x, y, d in zip(xs, ys, dys)]
        return ys, grad

    for t in tensors:
        if t.shape.rank == 0:
            raise ValueError("hvdlike.tensorflow.allgather: scalars cannot be gathered "
                             "along axis 0; reshape to [1] first (tf.reshape(x, [1])).")
    if not any(t.dtype.is_floating for t in tensors):
        return _allgather_raw(tensors, name, process_set)
    return list(fwd(*tensors))


def allgather(tensor: Any, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set,
              ignore_name_scope: bool = False) -> tf.Tensor:
    """Concatenate ``tensor`` from every rank along axis 0 (in rank order).

    Every rank passes a tensor with the same dtype and the same shape except the
    first dimension, which may differ; every rank gets the concatenation.  The
    gradient averages the incoming gradient over ranks and returns this rank's rows.
    """
    tensor = _to_tensor(tensor, "allgather", name)
    return _grouped_allgather_with_grad([tensor], name, process_set)[0]


def grouped_allgather(tensors: Sequence[Any], name: Optional[str] = None,
                      process_set: ProcessSet = global_process_set) -> List[tf.Tensor]:
    """Allgather a list of tensors in one call; returns a list (see :func:`allgather`)."""
    tensors = [_to_tensor(t, "grouped_allgather", name)
               for t in _listed(tensors, "hvdlike.tensorflow.grouped_allgather")]
    if not tensors:
        return []
    return _grouped_allgather_with_grad(tensors, name, process_set)


# --------------------------------------------------------------------------- broadcast

def _broadcast_raw(tensor, root_rank, name, process_set):
    def submit(op_name, a):
        return _one(_core.broadcast_async(a, root_rank, name=name or op_name,
                                          process_set=process_set))
    return _run("broadcast", submit, [tensor], [tensor.dtype], [tensor.shape], process_set,
                name)[0]


def broadcast(tensor: Any, root_rank: int, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set,
              ignore_name_scope: bool = False) -> tf.Tensor:
    """Return ``root_rank``'s value of ``tensor`` on every rank.

    Every rank passes a tensor of the same dtype and shape and the same root.  The
    gradient is the average of the incoming gradients on the root and zero elsewhere.
    """
    tensor = _to_tensor(tensor, "broadcast", name)

    @tf.custom_gradient
    def fwd(x):
        y = _broadcast_raw(x, root_rank, name, process_set)

        def grad(dy):
            g = _allreduce_raw([tf.convert_to_tensor(dy)], Average, 1.0, 1.0,
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
    n = _ps_size(process_set)

    def submit(op_name, a, s=None):
        handle = _core.alltoall_async(a, splits=s, name=name or op_name,
                                      process_set=process_set)

        def wait():
            out, received = handle.synchronize()
            return [out, np.asarray(received, dtype=np.int64)]
        return _Wait([handle], wait)
    shape = tensor.shape
    out_shape = (tf.TensorShape([None] + shape.as_list()[1:]) if shape.rank
                 else tf.TensorShape(None))
    inputs = [tensor] if splits is None else [tensor, splits]
    return _run("alltoall", submit, inputs, [tensor.dtype, tf.int64],
                [out_shape, tf.TensorShape([n])], process_set, name)


def alltoall(tensor: Any, splits: Optional[Any] = None, name: Optional[str] = None,
             process_set: ProcessSet = global_process_set,
             ignore_name_scope: bool = False) -> Union[tf.Tensor, Tuple[tf.Tensor, tf.Tensor]]:
    """Send rows ``splits[i]`` of ``tensor`` (axis 0) to rank i; receive from all.

    Without ``splits`` the first dimension must be divisible by the number of ranks
    and is split evenly.  Returns the received rows; with ``splits`` given,
    ``(received, received_splits)`` (Horovod's rule).  The gradient sends the incoming
    gradient back with ``received_splits``.
    """
    tensor = _to_tensor(tensor, "alltoall", name)
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


# --------------------------------------------------------------------------- reducescatter

def _scattered_shape(shape, process_set):
    if shape.rank is None or shape.rank == 0 or shape[0] is None:
        return tf.TensorShape([None] + shape.as_list()[1:]) if shape.rank else shape
    n, r, d0 = _ps_size(process_set), _ps_rank(process_set), shape[0]
    return tf.TensorShape([d0 // n + (1 if r < d0 % n else 0)] + shape.as_list()[1:])


def _reducescatter_raw(tensors, op, prescale_factor, postscale_factor, name, process_set):
    def submit(op_name, *arrays):
        kw = dict(op=op, name=name or op_name, process_set=process_set,
                  prescale_factor=prescale_factor, postscale_factor=postscale_factor)
        if len(arrays) == 1:
            return _one(_core.reducescatter_async(arrays[0], **kw))
        return _many(_core.grouped_reducescatter_async(list(arrays), **kw))
    return _run("reducescatter", submit, tensors, [t.dtype for t in tensors],
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
            gs = _allgather_raw(dys, None if name is None else name + "/grad", process_set)
            scale = prescale_factor * postscale_factor
            if op == Sum:  # Horovod's rule: Sum's gradient is the allgather times the set size
                scale = scale * _ps_size(process_set)
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
    tensor = _to_tensor(tensor, "reducescatter", name)
    c, ctx = compression.compress(tensor)
    out = _grouped_reducescatter_with_grad([c], as_reduce_op(op), prescale_factor,
                                           postscale_factor, name, process_set)[0]
    return compression.decompress(out, ctx)


def grouped_reducescatter(tensors: Sequence[Any], device_dense: str = "",
                          compression: Any = Compression.none, op: Any = Average,
                          name: Optional[str] = None,
                          process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> List[tf.Tensor]:
    """Reducescatter a list of tensors in one call (see :func:`reducescatter`)."""
    check_compression(compression, "hvdlike.tensorflow.grouped_reducescatter")
    tensors = [_to_tensor(t, "grouped_reducescatter", name)
               for t in _listed(tensors, "hvdlike.tensorflow.grouped_reducescatter")]
    if not tensors:
        return []
    pairs = [compression.compress(t) for t in tensors]
    outs = _grouped_reducescatter_with_grad([p[0] for p in pairs], as_reduce_op(op),
                                            prescale_factor, postscale_factor, name,
                                            process_set)
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


# --------------------------------------------------------------------------- control

def join() -> tf.Tensor:
    """Signal that this rank has no more data; blocks until every rank has joined.

    Returns (as an int32 scalar tensor) the rank that joined last.  Until then, this
    rank contributes zeros to allreduces issued by the ranks still training.
    """
    # the stateful submit op does the blocking call: it runs even if nobody reads the result
    return _run("join", lambda _: _done(np.asarray(_core.join(), np.int32)), [], [tf.int32],
                [tf.TensorShape([])])[0]


def barrier(process_set: ProcessSet = global_process_set) -> Any:
    """Block until every rank of ``process_set`` reaches the barrier."""
    def submit(_):
        _core.barrier(process_set=process_set)  # in the stateful op, as for join
        return _done(np.asarray(True))
    return _run("barrier", submit, [], [tf.bool], [tf.TensorShape([])], process_set)[0]


def timeline_step_done(variables: Sequence[Any]) -> None:
    """Mark the end of a training step in the timeline once ``variables`` (those the optimizer
    just updated) have been read back after their update.  Built into a graph only while a
    timeline runs when the step is traced (``HVDLIKE_TIMELINE`` set, or ``start_timeline``
    called before ``fit``): otherwise it costs nothing."""
    if _timeline.current is None:
        return
    if tf.executing_eagerly():
        _timeline.step_done()
        return

    def _done_now():
        _timeline.step_done()
        return np.int64(0)
    # reads of a variable come after the writes before them (automatic control dependencies)
    with tf.control_dependencies([tf.convert_to_tensor(v) for v in variables]):
        tf.numpy_function(_done_now, [], tf.int64, stateful=True, name="HvdlikeStepDone")


def _int_op(value, name):
    return tf.constant(value, dtype=tf.int32, name=name)


def _process_set(process_set_id, what):
    _runtime.state(f"hvdlike.tensorflow.{what}")
    ps = _process_sets._registry.get(process_set_id)
    if ps is None:
        raise ValueError(f"hvdlike.tensorflow.{what}: no process set has id {process_set_id}; "
                         f"registered ids: {sorted(_process_sets._registry)}")
    return ps


def rank_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """This process's rank in the process set (default: the world; -1 outside the set) as an
    int32 scalar tensor."""
    return _int_op(_process_set(process_set_id, "rank_op").rank(), name)


def size_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """Number of ranks in the process set (default: the world) as an int32 scalar tensor."""
    return _int_op(_process_set(process_set_id, "size_op").size(), name)


def process_set_included_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """1 if this process belongs to the process set, else 0, as an int32 scalar tensor."""
    return _int_op(int(_process_set(process_set_id, "process_set_included_op").included()),
                   name)


def local_rank_op(name: Optional[str] = None) -> tf.Tensor:
    """This process's rank on its node as an int32 scalar tensor."""
    return _int_op(_core.local_rank(), name)


def local_size_op(name: Optional[str] = None) -> tf.Tensor:
    """Number of ranks on this node as an int32 scalar tensor."""
    return _int_op(_core.local_size(), name)
