"""Horovod's TF1-style API: ``DistributedOptimizer`` of a ``tf.compat.v1.train.Optimizer``,
and ``BroadcastGlobalVariablesHook`` for ``tf.compat.v1.train.MonitoredTrainingSession``.

This is the training loop of Horovod's README (``hvd.DistributedOptimizer(
tf.compat.v1.train.AdagradOptimizer(...))``, ``hooks=[hvd.BroadcastGlobalVariablesHook(0)]``).
The wrapped optimizer's ``compute_gradients`` reduces the gradients over the process set with
the same ``GradientReducer`` as ``DistributedGradientTape`` (in a graph, the gradients go to
the engine in buckets, each as soon as backprop has computed it); ``apply_gradients`` is the original one, so
``minimize`` works as before. With ``op=Adasum`` the weight updates are combined instead
(``AdasumOptimizerV1``, Horovod's semantics).
"""
from typing import Any, Dict, List, Optional, Tuple

import tensorflow as tf

import hvdlike as _core
from hvdlike import ProcessSet, global_process_set
from hvdlike.tensorflow.functions import broadcast_variables
from hvdlike.tensorflow.gradients import GradientReducer, backward_passes


def is_v1_optimizer(optimizer: Any) -> bool:
    return isinstance(optimizer, tf.compat.v1.train.Optimizer)


def is_distributed_v1(optimizer: Any) -> bool:
    """Whether ``optimizer`` is one of hvdlike's wrappers of a tf.compat.v1 optimizer."""
    return isinstance(optimizer, _WrapperV1)


def _local_zeros(name: str, shape: Any, dtype: Any) -> Any:
    """A local variable of zeros (never broadcast or saved; initialised by the session's local
    init op), in the current variable scope."""
    return tf.compat.v1.get_variable(
        name, shape=shape, dtype=dtype, trainable=False,
        initializer=tf.compat.v1.zeros_initializer(),
        collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])


class _Aggregation:
    """One graph's (or eager mode's) local gradient sums for ``backward_passes_per_step``:
    local variables (never broadcast, initialised by the session's local init op)."""

    def __init__(self, grads: List[Any]) -> None:
        # a scope of its own: another optimizer's sums in the same graph are other variables
        with tf.compat.v1.variable_scope(None, default_name="hvdlike_aggregation"):
            self.counter = _local_zeros("backward_passes", (), tf.int64)
            self.sums = [None if g is None else _local_zeros(f"gradient_sum_{i}", g.shape, g.dtype)
                         for i, g in enumerate(grads)]
        self.apply_now: Any = None  # the last compute_gradients' "this pass applies"


def _dense(grad: Any) -> Any:
    return None if grad is None else tf.convert_to_tensor(grad)


def _graph_key() -> Any:
    """What an aggregation belongs to: the default graph, or None when eager."""
    return None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()


class _WrapperV1(tf.compat.v1.train.Optimizer):
    """A ``tf.compat.v1.train.Optimizer`` around another, whose slots and variables are the
    wrapped one's."""

    def __init__(self, optimizer: Any, reducer: GradientReducer, name: str,
                 use_locking: bool, backward_passes_per_step: int) -> None:
        super().__init__(use_locking=use_locking, name=name)
        self._optimizer = optimizer
        self._hvd_reducer = reducer
        self._bpps = backward_passes_per_step

    def get_slot(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> List[str]:
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args: Any, **kwargs: Any) -> List[Any]:
        return self._optimizer.variables(*args, **kwargs)


class DistributedOptimizerV1(_WrapperV1):
    """A ``tf.compat.v1.train.Optimizer`` whose gradients are reduced over ranks."""

    def __init__(self, optimizer: Any, reducer: GradientReducer, name: str,
                 use_locking: bool, backward_passes_per_step: int = 1,
                 average_aggregated_gradients: bool = False) -> None:
        super().__init__(optimizer, reducer, name, use_locking, backward_passes_per_step)
        self._average_aggregated = average_aggregated_gradients
        self._aggregations: Dict[Any, _Aggregation] = {}  # per graph (None: eager)

    def compute_gradients(self, *args: Any, **kwargs: Any) -> List[Tuple[Any, Any]]:
        """The wrapped optimizer's (gradient, variable) pairs, gradients reduced over ranks
        (``None`` kept: it must be ``None`` on every rank). With ``backward_passes_per_step``
        k > 1 the gradients are added to local sums, and every k-th call returns the sums
        reduced (``apply_gradients`` applies only then)."""
        pairs = list(self._optimizer.compute_gradients(*args, **kwargs))
        variables = [v for _, v in pairs]
        grads = [g for g, _ in pairs]
        if self._bpps == 1:
            return list(zip(self._hvd_reducer.reduce(grads, variables), variables))
        return list(zip(self._aggregate(grads, variables), variables))

    def _aggregate(self, grads: List[Any], variables: List[Any]) -> List[Any]:
        grads = [_dense(g) for g in grads]  # sparse gradients are summed densely
        agg = self._aggregations.get(_graph_key())
        if agg is None:
            agg = self._aggregations[_graph_key()] = _Aggregation(grads)
        adds = [s.assign_add(g) for s, g in zip(agg.sums, grads) if s is not None]
        with tf.control_dependencies(adds):
            count = agg.counter.assign_add(1)
        agg.apply_now = tf.equal(count, self._bpps)
        present = [i for i, g in enumerate(grads) if g is not None]

        def reduce_and_clear() -> List[Any]:
            sums = [agg.sums[i].read_value() for i in present]
            if self._average_aggregated:
                sums = [g / tf.cast(self._bpps, g.dtype) for g in sums]
            reduced = self._hvd_reducer.reduce(sums, [variables[i] for i in present])
            with tf.control_dependencies(reduced):
                clear = [agg.sums[i].assign(tf.zeros_like(agg.sums[i])) for i in present]
                clear.append(agg.counter.assign(0))
            with tf.control_dependencies(clear):
                return [tf.identity(g) for g in reduced]

        def local_sums() -> List[Any]:  # not applied: any values of the right shapes
            return [agg.sums[i].read_value() for i in present]

        out = tf.cond(agg.apply_now, reduce_and_clear, local_sums) if present else []
        out = list(out) if isinstance(out, (list, tuple)) else [out]
        result: List[Any] = [None] * len(grads)
        for i, g in zip(present, out):
            result[i] = g
        return result

    def register_local_var(self, var: Any) -> None:
        """Keep ``var``'s gradient local: not reduced over ranks (divided by the set size
        when ``scale_local_gradients``), as Horovod's ``register_local_var``."""
        self._hvd_reducer.register_local(var)

    def apply_gradients(self, grads_and_vars: Any, global_step: Any = None,
                        name: Optional[str] = None) -> Any:
        """The wrapped optimizer's update; with ``backward_passes_per_step`` k > 1 only on
        every k-th pass (the others just count ``global_step`` up), after
        ``compute_gradients`` (or ``minimize``) of that pass."""
        if self._bpps == 1:
            return self._optimizer.apply_gradients(grads_and_vars, global_step, name)
        agg = self._aggregations.get(_graph_key())
        if agg is None or agg.apply_now is None:
            raise RuntimeError(
                "hvdlike DistributedOptimizer: with backward_passes_per_step > 1, call this "
                "optimizer's compute_gradients (or minimize) before apply_gradients: it "
                "decides on which passes the summed gradients are applied.")
        grads_and_vars = list(grads_and_vars)

        def apply() -> Any:
            update = self._optimizer.apply_gradients(grads_and_vars, global_step, name)
            with tf.control_dependencies([update]):
                return tf.constant(True)

        def count_only() -> Any:
            if global_step is None:
                return tf.constant(False)
            with tf.control_dependencies([global_step.assign_add(1)]):
                return tf.constant(False)

        applied = tf.cond(agg.apply_now, apply, count_only)
        return applied if tf.executing_eagerly() else tf.group(applied)


class _Starts:
    """One graph's (or eager mode's) values of the variables at the last combination, and
    the count of passes: local variables, initialised by the session's local init op."""

    def __init__(self, variables: List[Any]) -> None:
        with tf.compat.v1.variable_scope(None, default_name="hvdlike_adasum"):
            self.passes = _local_zeros("passes", (), tf.int64)
            self.values = [_local_zeros(f"start_{i}", v.shape, v.dtype.base_dtype)
                           for i, v in enumerate(variables)]


def _flag(ops: List[Any], value: bool) -> Any:
    """A boolean tensor that comes after ``ops`` (what a ``tf.cond`` branch returns)."""
    with tf.control_dependencies(ops):
        return tf.constant(value)


class AdasumOptimizerV1(_WrapperV1):
    """``DistributedOptimizer(op=Adasum)`` of a ``tf.compat.v1.train.Optimizer``, as Horovod
    does it: each rank applies its own gradients with the wrapped optimizer (its slots stay
    local), and on every ``backward_passes_per_step``-th pass the change of each variable
    since the last combination is combined over the process set by Adasum; every rank then
    sets the variable to its value at the last combination plus the combined change."""

    def __init__(self, optimizer: Any, reducer: GradientReducer, name: str,
                 use_locking: bool, backward_passes_per_step: int = 1) -> None:
        super().__init__(optimizer, reducer, name, use_locking, backward_passes_per_step)
        self._starts: Dict[Any, _Starts] = {}  # per graph (None: eager)

    def compute_gradients(self, *args: Any, **kwargs: Any) -> List[Tuple[Any, Any]]:
        """The wrapped optimizer's (gradient, variable) pairs: this rank's own gradients
        (the updates are combined, in ``apply_gradients``)."""
        return list(self._optimizer.compute_gradients(*args, **kwargs))

    def register_local_var(self, var: Any) -> None:
        raise ValueError("hvdlike DistributedOptimizer: register_local_var is not supported "
                         "with op=Adasum and a tf.compat.v1 optimizer (nor in Horovod).")

    def apply_gradients(self, grads_and_vars: Any, global_step: Any = None,
                        name: Optional[str] = None) -> Any:
        """The wrapped optimizer's update of this rank's variables; on every k-th pass
        (``backward_passes_per_step``) the updates since the last one combined by Adasum."""
        grads_and_vars = list(grads_and_vars)
        variables = [v for g, v in grads_and_vars if g is not None]
        starts = self._starts.get(_graph_key())
        if starts is None:
            starts = self._starts[_graph_key()] = _Starts(variables)
        # the first pass takes the starting point from the variables, after the session (and
        # BroadcastGlobalVariablesHook) has set them
        first = tf.cond(tf.equal(starts.passes, 0),
                        lambda: _flag([s.assign(v) for s, v in zip(starts.values, variables)],
                                      True),
                        lambda: tf.constant(False))
        with tf.control_dependencies([first]):
            update = self._optimizer.apply_gradients(grads_and_vars, global_step, name)
        with tf.control_dependencies([update]):
            passes = starts.passes.assign_add(1)

        def combine() -> Any:
            with tf.control_dependencies([passes]):
                changes = [v.read_value() - s.read_value()
                           for v, s in zip(variables, starts.values)]
            combined = self._hvd_reducer.reduce(changes, variables)
            moved = [s.assign_add(c) for s, c in zip(starts.values, combined)]
            return _flag([v.assign(m) for v, m in zip(variables, moved)], True)

        combined = tf.cond(tf.equal(passes % self._bpps, 0), combine,
                           lambda: tf.constant(False))
        return combined if tf.executing_eagerly() else tf.group(combined)


def distributed_v1(optimizer: Any, use_locking: bool, backward_passes_per_step: int,
                   average_aggregated_gradients: bool, **reducer_settings: Any) -> Any:
    """``DistributedOptimizer`` for a ``tf.compat.v1.train.Optimizer``; ``reducer_settings``
    as for ``GradientReducer`` (its ``name`` also names the wrapper)."""
    bpps = backward_passes(backward_passes_per_step)
    reducer = GradientReducer(**reducer_settings)
    if reducer.op == _core.Adasum:
        if average_aggregated_gradients:
            raise ValueError("hvdlike DistributedOptimizer: average_aggregated_gradients is "
                             "not supported with op=Adasum and a tf.compat.v1 optimizer (as in "
                             "Horovod): the updates of every pass are combined, not gradients.")
        name = reducer_settings.get("name") or f"DistributedDelta{type(optimizer).__name__}"
        return AdasumOptimizerV1(optimizer, reducer, name, use_locking, bpps)
    name = reducer_settings.get("name") or f"Distributed{type(optimizer).__name__}"
    return DistributedOptimizerV1(optimizer, reducer, name, use_locking, bpps,
                                  average_aggregated_gradients)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """A ``SessionRunHook`` that sets every global variable to ``root_rank``'s value each
    time the session is created (so a checkpoint restored on ``root_rank`` reaches every
    rank), as Horovod's hook does. ``device`` is accepted for Horovod compatibility and has
    no effect."""

    def __init__(self, root_rank: int, device: str = "",
                 process_set: ProcessSet = global_process_set) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.process_set = process_set
        self.bcast_op: Any = None

    def begin(self) -> None:
        if tf.executing_eagerly():
            raise RuntimeError(
                "hvdlike BroadcastGlobalVariablesHook works in a tf.compat.v1 graph (a "
                "MonitoredTrainingSession); in TF2 use hvd.broadcast_variables(variables, "
                "root_rank=0) or hvdlike.keras.callbacks.BroadcastGlobalVariablesCallback(0).")
        graph = tf.compat.v1.get_default_graph()
        if self.bcast_op is None or self.bcast_op.graph is not graph:
            self.bcast_op = broadcast_variables(tf.compat.v1.global_variables(),
                                                self.root_rank, process_set=self.process_set)

    def after_create_session(self, session: Any, coord: Any) -> None:
        if self.bcast_op is not None:
            session.run(self.bcast_op)
