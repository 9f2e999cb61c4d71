"""A parameter-server worker's optimizer: a subclass of the user's optimizer class whose
update sends the gradients to the servers and assigns the weights they send back
(``ParameterServerTraining.push_and_pull``), from Keras 3's ``apply`` or tf_keras's
``apply_gradients``."""
from typing import TYPE_CHECKING, Any, List

import numpy as np
import tensorflow as tf

from hvdlike.tensorflow import compat

if TYPE_CHECKING:
    from hvdlike.tensorflow.parameter_server import ParameterServerTraining


def worker_optimizer(optimizer: Any, trainer: "ParameterServerTraining") -> Any:
    """A subclass of ``type(optimizer)`` whose update pushes the gradients to the servers and
    assigns the weights they send back."""
    base = type(optimizer)
    mixin = _LegacyPush if compat.use_legacy_keras() else _Keras3Push
    cls = type(base.__name__, (mixin, base), {"_hvd_trainer": trainer})
    cls.__module__, cls.__qualname__ = base.__module__, base.__qualname__
    return cls.from_config(optimizer.get_config())


class _PushMixin:
    _hvd_trainer: "ParameterServerTraining"

    def _hvd_push(self, grads: List[Any], variables: List[Any]) -> None:
        trainer = self._hvd_trainer
        if [id(v) for v in variables] != [id(v) for v in trainer.variables]:
            order = {id(v): i for i, v in enumerate(variables)}
            missing = [v.name for v in trainer.variables if id(v) not in order]
            raise ValueError("ParameterServerTraining: the optimizer must update exactly the "
                             f"model's trainable variables, in order (missing: {missing[:5]})")
        dense = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                 for g, v in zip(grads, variables)]

        def exchange(*arrays: np.ndarray) -> List[np.ndarray]:
            return trainer.push_and_pull(list(arrays))

        new = tf.numpy_function(exchange, dense, [tf.float32] * len(dense), stateful=True,
                                name="HvdlikePushPull")
        for v, value in zip(variables, new):
            v.assign(tf.cast(tf.reshape(value, v.shape), v.dtype))
        self.iterations.assign_add(1)


class _Keras3Push(_PushMixin):
    def apply(self, grads: Any, trainable_variables: Any = None) -> None:
        variables = list(trainable_variables if trainable_variables is not None
                          else self._hvd_trainer.variables)
        self._hvd_push(list(grads), variables)


class _LegacyPush(_PushMixin):
    def apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        pairs = list(grads_and_vars)
        self._hvd_push([g for g, _ in pairs], [v for _, v in pairs])
        return self.iterations
