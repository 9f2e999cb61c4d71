"""How a collective runs on TensorFlow values: the graph/eager bridge.

Every collective has ONE implementation: a function on NumPy arrays that submits a request
to the hvdlike engine and returns how to wait for it.  Eager mode calls it and waits at once;
in a graph (``tf.function``, as Keras ``fit`` compiles its train step, or a v1 graph) it is
a submit op and a wait op (see ``run``).  Shapes are set statically on the graph
outputs wherever they are known.

Requests pair across ranks by name (an explicit ``name=``, or in a graph the op's name;
unnamed eager calls pair in call order), in whatever order each rank runs them; a name
with mismatched metadata (dtype, shape, op, root, splits) raises
``tf.errors.FailedPreconditionError`` on every rank, as Horovod does (the message names the
ranks and their values; the NumPy API raises ``hvdlike.CollectiveMismatchError``). In a
``tf.function``, TensorFlow reports that error, raised inside a Python function op, as
``UnknownError``; its message keeps ours, prefixed ``FailedPreconditionError``. A bad value
on any rank raises ``tf.errors.InvalidArgumentError`` on every rank
(``CollectiveInputError``), eager and in a graph.  A v1 graph's wait ops (the
``HvdlikeWait`` kernel) keep both classes.
"""
import itertools
from typing import Any

import numpy as np
import tensorflow as tf

import hvdlike as _core
from hvdlike import Average, Sum, global_process_set
from hvdlike import process_sets as _process_sets
from hvdlike import runtime as _runtime
from hvdlike.base import tracebacks
from hvdlike.base.reduce_ops import as_reduce_op
from hvdlike.submission import require_name
from hvdlike.tensorflow import compat, devices, wait_kernel

SUPPORTED_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int8, tf.int16,
                    tf.int32, tf.int64, tf.uint8, tf.uint16, tf.uint32, tf.uint64, tf.bool)


def _label(tensor, name):
    if name:
        return repr(name)
    try:
        return repr(tensor.name)
    except (AttributeError, ValueError):
        return f"of shape {tensor.shape.as_list() if tensor.shape.rank is not None else '?'}"


def to_tensor(value, what, name):
    """Accept tf.Tensor / tf.Variable / NumPy / Python values; reject strings & co."""
    if isinstance(value, tf.IndexedSlices):
        raise TypeError(f"hvdlike.tensorflow.{what}: tf.IndexedSlices is only supported by "
                        "allreduce (and the gradient tape / optimizer); convert it with "
                        "tf.convert_to_tensor(x) first.")
    t = tf.convert_to_tensor(value)
    if t.dtype not in SUPPORTED_DTYPES:
        supported = ", ".join(d.name for d in SUPPORTED_DTYPES)
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
            "(jit_compile=True), which cannot compile hvdlike's collectives (they run on the "
            "host). Call the collective between compiled parts instead: e.g. one "
            "tf.function(jit_compile=True) returning the gradients, the all-reduce, and "
            "another compiling the update (docs/tensorflow.md, 'XLA'); Keras's "
            "model.fit(jit_compile=True) with a DistributedOptimizer does so itself. Or "
            "compile without XLA (jit_compile=False).")


def ps_size(process_set):
    return process_set.size()


def ps_rank(process_set):
    return process_set.rank()


_PENDING = {}  # key -> wait function (Wait) of a request submitted by a graph op


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
    ``CollectiveInputError`` (in a graph TensorFlow turns it into
    ``InvalidArgumentError`` itself), as in Horovod."""
    try:
        return wait()
    except _core.CollectiveMismatchError as exc:
        raise _same_quiet(mismatch_error(str(exc)), exc) from None
    except _core.NotInitializedError:
        raise  # as it is: Horovod raises a ValueError there too
    except ValueError as exc:
        raise _same_quiet(CollectiveInputError(str(exc)), exc) from None


def _same_quiet(error, original):
    """``error``, marked to be printed only where ``original`` would be (see
    ``hvdlike.engine.checks.raised_on_every_rank``), and as the caller's error
    (``hvdlike.base.tracebacks``)."""
    error.hvdlike_quiet = getattr(original, "hvdlike_quiet", False)
    return tracebacks.mark(error)


def run(what, submit, inputs, out_dtypes, out_shapes, process_set=None, name=None):
    """Run a collective on TF tensors: ``submit(op_name, *numpy_inputs)`` hands the request
    to the engine and returns a function that waits and returns the outputs (a list).

    Eager: submit and wait at once (``op_name`` None: an unnamed request pairs in call order).
    Graph: a submit op and a wait op (``submit_op``, ``wait_op``); a
    ``process_set`` that is not registered raises ``ValueError`` here, as in Horovod. A
    ``name`` that is not a string raises ``TypeError`` here (in a graph: when traced).
    """
    if tf.executing_eagerly():
        require_name(name, f"hvdlike.tensorflow.{what}")
        arrays = [devices.to_core(t) for t in inputs]
        outs = _outputs(lambda: submit(None, *arrays)())  # errors at submit converted too
        return [devices.from_core(o, d) for o, d in zip(outs, out_dtypes)]
    check_graph_request(what, name, process_set)
    return wait_op(what, [submit_op(what, submit, inputs)], out_dtypes, out_shapes)


def check_graph_request(what, name, process_set):
    """What a graph collective checks when traced: its ``name`` and ``process_set``."""
    require_name(name, f"hvdlike.tensorflow.{what}")
    if process_set is not None and process_set is not global_process_set:
        _process_sets.require_registered(process_set, f"hvdlike.tensorflow.{what}")


def _op_base_name(what):
    return "Hvdlike" + "".join(p.title() for p in what.split("_"))


def submit_op(what, submit, inputs):
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


def wait_op(what, keys, out_dtypes, out_shapes):
    """Graph: one stateless op that waits for the requests behind ``keys`` and returns their
    outputs, in order.  Not chained to anything: ranks that build independent collectives in
    different orders submit all of them before any wait blocks.  In a tf.compat.v1 graph
    (its ``tf.cond`` branches included) it is the asynchronous ``HvdlikeWait`` kernel
    (``.wait_kernel``), which holds no TensorFlow thread while it waits; in a
    ``tf.function`` (whose submits run in program order) and where that kernel is missing,
    a ``tf.numpy_function``."""
    name = _op_base_name(what) + "Wait"
    kernel = None
    if not tf.compat.v1.executing_eagerly_outside_functions() and _wait_kernel_enabled():
        kernel = wait_kernel.get(_PENDING.pop, _outputs)
    if kernel is not None:
        outs = kernel.op(keys, out_dtypes, name)
    else:
        @tracebacks.short  # TensorFlow prints the traceback of an error raised here
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


class Wait:
    """A submitted request's wait function: ``handles``, the engine requests it waits for,
    and calling it waits for them and returns the outputs (a list)."""

    __slots__ = ("handles", "outputs")

    def __init__(self, handles, outputs):
        self.handles, self.outputs = handles, outputs

    def __call__(self):
        return self.outputs()


def done(*outs):
    """A submit's wait function for outputs that are already there."""
    return Wait([], lambda: list(outs))


def one(handle):
    """A submit's wait function for a handle whose result is one array."""
    return Wait([handle], lambda: [handle.synchronize()])


def many(handle):
    """A submit's wait function for a handle whose result is a list or tuple of arrays."""
    return Wait([handle], lambda: list(handle.synchronize()))


def normalize_op(op, average, what):
    if average is not None:
        if op is not None:
            raise ValueError(f"hvdlike.tensorflow.{what}: pass either op= or the deprecated "
                             "average=, not both.")
        return Average if average else Sum
    return Average if op is None else as_reduce_op(op)
