"""Keras 3 ``fit`` with ``jit_compile=True`` and a distributed optimizer: XLA compiles the
step's computation, the collectives run between its parts.

XLA cannot compile hvdlike's collectives (they run on the host, outside TensorFlow's
kernels), so a train step compiled whole would fail. Here a Keras 3 model whose optimizer is
distributed and whose ``jit_compile`` is on gets a train function in three parts:

1. the model's ``train_step`` (forward, loss, gradients, metrics), compiled by XLA, with the
   optimizer's ``apply`` replaced by a capture of the gradients it was given;
2. the optimizer's ``apply`` with those gradients, outside XLA: the gradient reduction
   across ranks (and a ``LossScaleOptimizer``'s agreement on finite gradients);
3. inside it, the wrapped optimizer's own update (Keras's ``apply`` on the reduced
   gradients), compiled by XLA.

A ``train_step`` that reads the weights after applying the gradients sees them before the
update (the update runs after the step's compiled part); Keras's own ``train_step`` does not.
"""
import contextlib
import threading
from typing import Any, Callable, Iterator, List, Tuple

import tensorflow as tf

from hvdlike.tensorflow import compat

_state = threading.local()


def compiling_update() -> bool:
    """True while a split step traces its optimizer's update: the distributed optimizer
    then compiles the wrapped optimizer's ``apply`` with XLA (part 3)."""
    return getattr(_state, "update", False)


def compiled(apply: Callable[[List[Any], Any], Any]) -> Callable[[List[Any], Any], Any]:
    """``apply(grads, trainable_variables)``, its computation compiled by XLA."""
    def run(grads: List[Any], trainable_variables: Any) -> Any:
        return tf.function(lambda g: apply(g, trainable_variables), jit_compile=True,
                           autograph=False)(grads)
    return run


@contextlib.contextmanager
def _capturing(optimizer: Any, captured: List[Tuple[Any, Any]]) -> Iterator[None]:
    """While tracing part 1: ``optimizer.apply`` records its arguments and applies nothing."""
    def apply(grads: Any, trainable_variables: Any = None) -> None:
        captured.append((list(grads), trainable_variables))

    object.__setattr__(optimizer, "apply", apply)
    try:
        yield
    finally:
        object.__delattr__(optimizer, "apply")


@contextlib.contextmanager
def _update() -> Iterator[None]:
    _state.update = True
    try:
        yield
    finally:
        _state.update = False


def split_step(optimizer: Any, train_step: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``train_step`` run as the three parts above, for a model whose optimizer is
    ``optimizer`` (a distributed optimizer, possibly inside a ``LossScaleOptimizer``)."""
    applied: List[Tuple[Any, Any]] = []

    def computation(data: Any) -> Tuple[Any, List[Any]]:
        del applied[:]
        with _capturing(optimizer, applied):
            logs = train_step(data)
        if len(applied) != 1:
            raise RuntimeError(
                f"hvdlike: an XLA-compiled train step (jit_compile=True) applied gradients "
                f"{len(applied)} times; with a DistributedOptimizer it must apply them once "
                "(model.optimizer.apply or apply_gradients). Compile with jit_compile=False "
                "for a step that does otherwise.")
        return logs, applied[0][0]

    compiled_computation = tf.function(computation, jit_compile=True, autograph=False)

    def step(data: Any) -> Any:
        logs, grads = compiled_computation(data)
        with _update():
            optimizer.apply(grads, applied[0][1])
        return logs

    return step


def _split_when_distributed(make_train_function: Callable[..., Any],
                            is_distributed: Callable[[Any], bool]) -> Callable[..., Any]:
    """Keras 3's ``make_train_function``; for a compiled model with ``jit_compile`` on and a
    distributed optimizer, the train function runs ``split_step`` (itself compiled without
    XLA around its XLA-compiled parts)."""
    def make(self: Any, force: bool = False) -> Any:
        if (self.train_function is not None and not force) or self.run_eagerly \
                or not self.jit_compile or not is_distributed(self.optimizer):
            return make_train_function(self, force)
        self._jit_compile = False  # (the function around the parts)
        try:
            self.train_function = self._make_function(split_step(self.optimizer,
                                                                 self.train_step))
        finally:
            self._jit_compile = True
        return self.train_function

    make._hvdlike_splits = True  # type: ignore[attr-defined]
    return make


def install(is_distributed: Callable[[Any], bool]) -> None:
    """Give Keras 3's TensorFlow trainer the split train function (once). ``is_distributed``
    tells a model's optimizer that reduces across ranks."""
    owner = compat.keras3_model_method_owner("make_train_function")
    if owner is None or compat.keras().backend.backend() != "tensorflow" or getattr(owner.make_train_function, "_hvdlike_splits", False):
        return
    owner.make_train_function = _split_when_distributed(owner.make_train_function,
                                                        is_distributed)
