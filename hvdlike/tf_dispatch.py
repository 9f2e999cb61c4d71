"""The top level's bridge to TensorFlow, without importing it: the core stays TensorFlow-free.

``accepts_tf_values`` wraps a NumPy collective of ``hvdlike.collectives`` for ``hvdlike``'s
namespace: a tf.Tensor, tf.Variable, Keras variable or tf.IndexedSlices (or a list of them) goes
to the function of the same name in ``hvdlike.tensorflow``; anything else takes the NumPy
path. ``pin_gpu`` pins TensorFlow's GPU too when TensorFlow is loaded. TensorFlow is looked up
in ``sys.modules`` only: if the program has not imported it, no value can be a TensorFlow value.
"""
import functools
import inspect
import sys
from typing import Any, Callable, Optional, TypeVar

from . import runtime
from .transport import gpu

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
            from . import tensorflow

            arguments = signature.bind(x, *args, **kwargs).arguments
            first = arguments.pop(next(iter(signature.parameters)))
            return getattr(tensorflow, fn.__name__)(first, **arguments)
        return fn(x, *args, **kwargs)

    return dispatch  # type: ignore[return-value]


def pin_gpu() -> Optional[int]:
    """Make this rank use the GPU numbered ``local_rank()`` (modulo the GPUs visible): CuPy's
    current device and, when TensorFlow is imported, TensorFlow's only visible GPU, with
    memory growth. Call it on every rank after ``init()`` and before building a model.
    Returns the GPU's index, or None on a machine without GPUs (nothing is changed then).
    Ranks that share a GPU (more ranks than GPUs) work, staged through host memory."""
    local_rank = runtime.state("hvdlike.pin_gpu()").local_rank
    index = None
    if "tensorflow" in sys.modules:
        from .tensorflow.devices import pin_gpu as pin_tensorflow

        index = pin_tensorflow(local_rank)
    on_cupy = gpu.use_gpu(local_rank)
    return index if on_cupy is None else on_cupy
