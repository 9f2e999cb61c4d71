"""Control and introspection ops on TensorFlow values: join, barrier, the timeline's step mark,
and this rank's rank and sizes as tensors."""
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf

import hvdlike as _core
from hvdlike import ProcessSet, global_process_set
from hvdlike import process_sets as _process_sets
from hvdlike import runtime as _runtime
from hvdlike.engine import timeline as _timeline
from hvdlike.tensorflow import bridge


def join() -> tf.Tensor:
    """Signal that this rank has no more data; blocks until every rank has joined.

    Returns (as an int32 scalar tensor) the rank that joined last.  Until then, this
    rank contributes zeros to allreduces issued by the ranks still training.
    """
    # the stateful submit op does the blocking call: it runs even if nobody reads the result
    return bridge.run("join", lambda _: bridge.done(np.asarray(_core.join(), np.int32)), [],
                      [tf.int32], [tf.TensorShape([])])[0]


def barrier(process_set: ProcessSet = global_process_set) -> Any:
    """Block until every rank of ``process_set`` reaches the barrier."""
    def submit(_):
        _core.barrier(process_set=process_set)  # in the stateful op, as for join
        return bridge.done(np.asarray(True))
    return bridge.run("barrier", submit, [], [tf.bool], [tf.TensorShape([])], process_set)[0]


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
    registered = _process_sets.registered()
    ps = registered.get(process_set_id)
    if ps is None:
        raise ValueError(f"hvdlike.tensorflow.{what}: no process set has id {process_set_id}; "
                         f"registered ids: {sorted(registered)}")
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
