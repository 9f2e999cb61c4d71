"""Elastic states for TensorFlow (``horovod.tensorflow.elastic``'s names); see
``hvdlike.elastic`` for how elastic training runs."""
from typing import Any, Dict, List, Optional

import numpy as np
import tensorflow as tf

from hvdlike.elastic import ObjectState, State, is_replacement, run  # noqa: F401 - re-exported


def _optimizer_variables(optimizer: Any, model: Any) -> List[Any]:
    """The optimizer's variables, built first if the optimizer has not run yet (a fresh
    process resuming from a committed state, before its first step)."""
    if optimizer is None:
        return []
    variables = optimizer.variables
    if callable(variables):  # tf_keras's legacy optimizers
        variables = variables()
    if not variables or (hasattr(optimizer, "built") and not optimizer.built):
        build = getattr(optimizer, "build", None)
        if build is not None and model is not None:
            build(model.trainable_variables)
            variables = optimizer.variables
            if callable(variables):
                variables = variables()
    return list(variables)


class TensorFlowKerasState(ObjectState):
    """A Keras model's weights and its optimizer's variables, plus picklable attributes:
    ``TensorFlowKerasState(model, optimizer, epoch=0, batch=0)``."""

    def __init__(self, model: Any, optimizer: Optional[Any] = None, **kwargs: Any) -> None:
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer",
                                                                         None)
        super().__init__(**kwargs)

    def _snapshot(self) -> Dict[str, Any]:
        snapshot = super()._snapshot()
        snapshot["_model"] = [np.array(w) for w in self.model.get_weights()]
        snapshot["_optimizer"] = [np.array(v.numpy())
                                  for v in _optimizer_variables(self.optimizer, self.model)]
        return snapshot

    def _apply(self, snapshot: Dict[str, Any]) -> None:
        snapshot = dict(snapshot)
        self.model.set_weights(snapshot.pop("_model"))
        values = snapshot.pop("_optimizer")
        variables = _optimizer_variables(self.optimizer, self.model)
        if values and len(values) != len(variables):
            raise ValueError(
                f"hvdlike.elastic: the committed state has {len(values)} optimizer variables "
                f"but this optimizer has {len(variables)}: was it saved from another model?")
        for variable, value in zip(variables, values):
            variable.assign(value)
        super()._apply(snapshot)

    def on_reset(self) -> None:
        # Keras traced its train step against the old world; trace it again on the new one.
        for name in ("train_function", "test_function", "predict_function"):
            if getattr(self.model, name, None) is not None:
                setattr(self.model, name, None)
        super().on_reset()


class TensorFlowState(ObjectState):
    """A list of ``tf.Variable`` plus picklable attributes."""

    def __init__(self, variables: Optional[List[tf.Variable]] = None, **kwargs: Any) -> None:
        self.variables = list(variables or [])
        super().__init__(**kwargs)

    def _snapshot(self) -> Dict[str, Any]:
        snapshot = super()._snapshot()
        snapshot["_variables"] = [np.array(v.numpy()) for v in self.variables]
        return snapshot

    def _apply(self, snapshot: Dict[str, Any]) -> None:
        snapshot = dict(snapshot)
        for variable, value in zip(self.variables, snapshot.pop("_variables")):
            variable.assign(value)
        super()._apply(snapshot)
