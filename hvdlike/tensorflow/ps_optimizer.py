"""A parameter-server worker's optimizer: a subclass of the user's optimizer class whose
update sends the gradients to the servers and assigns the weights they send back
(``ParameterServerTraining.push_and_pull``), from Keras 3's ``apply`` or tf_keras's
``apply_gradients``; and the worker's ``train_step``, which first takes the servers' weights
(``pull``), once its batch is there, so that the optimizer only pushes."""
import contextlib
from typing import TYPE_CHECKING, Any, Iterator, List

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
        if trainer.pulls_in_step:  # the step began with a pull: push, and take no weights

            def push(*arrays: np.ndarray) -> np.ndarray:
                if not trainer.should_stop:  # the pull said stop: this step is the last
                    trainer.push(list(arrays))
                return np.zeros((), np.int64)

            tf.numpy_function(push, dense, tf.int64, stateful=True, name="HvdlikePush")
        else:

            def exchange(*arrays: np.ndarray) -> List[np.ndarray]:
                return trainer.push_and_pull(list(arrays))

            new = tf.numpy_function(exchange, dense, [tf.float32] * len(dense), stateful=True,
                                    name="HvdlikePushPull")
            _assign_all(variables, new)
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


def _assign_all(variables: List[Any], values: List[Any]) -> None:
    """Assign each variable its new value (as received: float32, flat or shaped)."""
    for v, value in zip(variables, values):
        v.assign(tf.cast(tf.reshape(value, v.shape), v.dtype))


@contextlib.contextmanager
def pull_before_each_step(model: Any, trainer: "ParameterServerTraining") -> Iterator[None]:
    """Within: ``model.train_step`` (what Keras ``fit`` runs, its batch in hand) first assigns
    the servers' weights (``trainer.pull``), and its optimizer then only pushes, so that the
    gradients are computed on weights as fresh as the batch, however long the input pipeline
    took. After: the model's own ``train_step`` again, and no step function traced within."""
    step, own = model.train_step, "train_step" in vars(model)

    def train_step(data: Any) -> Any:
        def pull(_batch_is_here: np.ndarray) -> List[np.ndarray]:
            return trainer.pull()

        # one value of the batch as input, so that in a traced step the pull waits for the
        # batch (its size would not do: a static shape makes it a constant)
        first = tf.nest.flatten(data, expand_composites=True)[:1]
        here = [tf.reshape(t, [-1])[:1] for t in first] or [tf.constant(0)]
        new = tf.numpy_function(pull, here, [tf.float32] * len(trainer.variables),
                                stateful=True, name="HvdlikePull")
        # TF's automatic control dependencies order these before the step reads the weights
        _assign_all(trainer.variables, new)
        trainer.pulls_in_step = True
        try:
            return step(data)
        finally:
            trainer.pulls_in_step = False

    model.train_step = train_step
    model.train_function = None  # Keras keeps the traced step between fits
    try:
        yield
    finally:
        if own:
            model.train_step = step
        else:
            del model.train_step
        model.train_function = None
