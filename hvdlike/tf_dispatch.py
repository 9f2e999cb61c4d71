"""Let the top-level NumPy collectives take TensorFlow values too, without importing TensorFlow.

A collective decorated with ``accepts_tf_values`` hands a tf.Tensor, tf.Variable, Keras variable
or tf.IndexedSlices (or a list of them) to the function of the same name in
``hvdlike.tensorflow.ops``; anything else takes the NumPy path. TensorFlow is looked up in
``sys.modules`` only: if the program has not imported it, no value can be a TensorFlow value.
"""
import functools
import inspect
import sys
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def is_tf_value(x: Any) -> bool:
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return False
    if isinstance(x, (list, tuple)):
        if not x:
            return False
        x = x[0]
    return bool(tf.is_tensor(x) or isinstance(x, (tf.Variable, tf.IndexedSlices)))


def accepts_tf_values(fn: F) -> F:
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def dispatch(x: Any, *args: Any, **kwargs: Any) -> Any:
        if is_tf_value(x):
            from .tensorflow import ops

            arguments = signature.bind(x, *args, **kwargs).arguments
            first = arguments.pop(next(iter(signature.parameters)))
            return getattr(ops, fn.__name__)(first, **arguments)
        return fn(x, *args, **kwargs)

    return dispatch  # type: ignore[return-value]
