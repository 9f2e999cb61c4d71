"""Horovod's TF1-style API: ``DistributedOptimizer`` of a ``tf.compat.v1.train.Optimizer``,
and ``BroadcastGlobalVariablesHook`` for ``tf.compat.v1.train.MonitoredTrainingSession``.

This is the training loop of Horovod's README (``hvd.DistributedOptimizer(
tf.compat.v1.train.AdagradOptimizer(...))``, ``hooks=[hvd.BroadcastGlobalVariablesHook(0)]``).
The wrapped optimizer's ``compute_gradients`` reduces the gradients over the process set with
the same ``GradientReducer`` as ``DistributedGradientTape`` (in a graph, each gradient goes to
the engine as soon as backprop has computed it); ``apply_gradients`` is the original one, so
``minimize`` works as before.
"""
from typing import Any, List, Tuple

import tensorflow as tf

import hvdlike as _core
from hvdlike.reduce_ops import as_reduce_op

from hvdlike.tensorflow.functions import broadcast_variables
from hvdlike.tensorflow.gradients import GradientReducer


def is_v1_optimizer(optimizer: Any) -> bool:
    return isinstance(optimizer, tf.compat.v1.train.Optimizer)


class DistributedOptimizerV1(tf.compat.v1.train.Optimizer):
    """A ``tf.compat.v1.train.Optimizer`` whose gradients are reduced over ranks."""

    def __init__(self, optimizer: Any, reducer: GradientReducer, name: str,
                 use_locking: bool) -> None:
        super().__init__(use_locking=use_locking, name=name)
        self._optimizer = optimizer
        self._hvd_reducer = reducer

    def compute_gradients(self, *args: Any, **kwargs: Any) -> List[Tuple[Any, Any]]:
        """The wrapped optimizer's (gradient, variable) pairs, gradients reduced over ranks
        (``None`` kept: it must be ``None`` on every rank)."""
        pairs = list(self._optimizer.compute_gradients(*args, **kwargs))
        variables = [v for _, v in pairs]
        reduced = self._hvd_reducer.reduce([g for g, _ in pairs], variables)
        return list(zip(reduced, variables))

    def register_local_var(self, var: Any) -> None:
        """Keep ``var``'s gradient local: not reduced over ranks (divided by the set size
        when ``scale_local_gradients``), as Horovod's ``register_local_var``."""
        self._hvd_reducer.register_local(var)

    def apply_gradients(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> List[str]:
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args: Any, **kwargs: Any) -> List[Any]:
        return self._optimizer.variables(*args, **kwargs)


def distributed_v1(optimizer: Any, use_locking: bool, backward_passes_per_step: int,
                   **reducer_settings: Any) -> Any:
    """``DistributedOptimizer`` for a ``tf.compat.v1.train.Optimizer``; ``reducer_settings``
    as for ``GradientReducer`` (its ``name`` also names the wrapper)."""
    if backward_passes_per_step != 1:
        raise ValueError(
            "hvdlike DistributedOptimizer: backward_passes_per_step > 1 needs a Keras optimizer "
            "(keras.optimizers); with a tf.compat.v1 optimizer, sum the gradients of k "
            "batches yourself and apply them once.")
    if as_reduce_op(reducer_settings.get("op")) == _core.Adasum:
        raise ValueError(
            "hvdlike DistributedOptimizer: op=Adasum with a tf.compat.v1 optimizer is not "
            "supported (Horovod combines the weight updates there, not the gradients); use a "
            "Keras optimizer, or DistributedGradientTape(op=Adasum).")
    reducer = GradientReducer(**reducer_settings)
    name = reducer_settings.get("name") or f"Distributed{type(optimizer).__name__}"
    return DistributedOptimizerV1(optimizer, reducer, name, use_locking)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """A ``SessionRunHook`` that sets every global variable to ``root_rank``'s value each
    time the session is created (so a checkpoint restored on ``root_rank`` reaches every
    rank), as Horovod's hook does. ``device`` is accepted for Horovod compatibility and has
    no effect."""

    def __init__(self, root_rank: int, device: str = "",
                 process_set: _core.ProcessSet = _core.global_process_set) -> None:
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
