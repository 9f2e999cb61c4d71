"""TensorFlow / Keras version shims: the only place that knows which Keras is in use.

Keras 3 (``import keras``) is the default.  With ``TF_USE_LEGACY_KERAS=1`` TensorFlow
itself uses ``tf_keras`` (Keras 2), and so do we.
"""
import os
from types import ModuleType
from typing import Any, Tuple

import tensorflow as tf

try:  # private, but stable since TF 2.0; used only to detect XLA compilation
    from tensorflow.python.ops import control_flow_util as _cfu
except Exception:  # pragma: no cover - very old/new TF
    _cfu = None

try:  # private, but stable since TF 2.12: whether a gradient tape may record an eager op
    from tensorflow.python.eager.record import could_possibly_record as _may_record
except Exception:  # pragma: no cover - another TF layout: assume a tape may record
    def _may_record() -> bool:
        return True

try:  # private, but stable since TF 2.0: a NumPy array as an eager tensor, without the
    # conversion registry's dispatch that tf.convert_to_tensor goes through (7 against 14 us)
    from tensorflow.python.eager import context as _context
    from tensorflow.python.framework.constant_op import convert_to_eager_tensor as _to_eager
except Exception:  # pragma: no cover - another TF layout
    _to_eager = None

try:  # private, but stable since TF 2.0: AutoGraph's list of modules it leaves as they are
    from tensorflow.python.autograph.core import config as _autograph_config
except Exception:  # pragma: no cover - very old/new TF
    _autograph_config = None


def _leave_hvdlike_unconverted() -> None:
    """Have AutoGraph leave hvdlike's functions as written, as it leaves TensorFlow's and
    Keras's. Called from a user's ``tf.function`` they would be converted, closures included,
    so that the Python hvdlike's ops run at every step (submitting each gradient, waiting)
    would be AutoGraph's rewrite of it, twice as slow (a custom loop over 96 gradients, one
    submit op each: 28.8 against 14.9 ms a step at np=2, docs/performance.md). hvdlike's
    graph code uses ``tf.cond`` itself and needs no conversion. Without the (private) rule
    list, AutoGraph converts as before: slower, not wrong."""
    config = _autograph_config
    if config is not None:
        config.CONVERSION_RULES = (config.DoNotConvert("hvdlike"),) + tuple(config.CONVERSION_RULES)


_leave_hvdlike_unconverted()  # once, when this module is first imported


def use_legacy_keras() -> bool:
    """True when TF_USE_LEGACY_KERAS selects tf_keras (Keras 2), read exactly as TensorFlow
    reads it ("1", "true" or "True"; anything else, "yes" included, means Keras 3)."""
    return os.environ.get("TF_USE_LEGACY_KERAS") in ("true", "True", "1")


def keras() -> ModuleType:
    """The Keras module TensorFlow uses in this process (keras 3 or tf_keras)."""
    if use_legacy_keras():
        import tf_keras
        return tf_keras
    import keras as k
    return k


def is_keras3() -> bool:
    return not use_legacy_keras()


def optimizer_base_classes() -> Tuple[type, ...]:
    """Optimizer base classes we can wrap, for the Keras in use."""
    k = keras()
    bases = [k.optimizers.Optimizer]
    if use_legacy_keras():
        legacy = getattr(k.optimizers, "legacy", None)
        if legacy is not None:
            bases.append(legacy.Optimizer)
    return tuple(bases)


def loss_scale_optimizer_class() -> type:
    k = keras()
    return k.mixed_precision.LossScaleOptimizer


def keras3_model_method_owner(name: str) -> Any:
    """The Keras 3 class that defines ``keras.Model``'s method ``name`` (found on its bases,
    so the module path does not matter), or None with tf_keras or where Keras no longer has
    it. hvdlike wraps two: ``_resolve_auto_jit_compile`` (private; turns
    ``compile(jit_compile="auto")`` into on or off) and ``compile``."""
    if use_legacy_keras():
        return None
    for cls in keras().Model.__mro__:
        if name in vars(cls):
            return cls
    return None  # pragma: no cover - another Keras layout


def tf_keras_loss_scale_module() -> Any:
    """tf_keras's LossScaleOptimizer module (private, the same path in tf_keras 2.16-2.21),
    or None with Keras 3 or where it is not found."""
    if not use_legacy_keras():
        return None
    try:
        from tf_keras.src.mixed_precision import loss_scale_optimizer
    except ImportError:  # pragma: no cover - another tf_keras layout
        return None
    return loss_scale_optimizer


def eager_tensor(value: Any, dtype: tf.DType) -> tf.Tensor:
    """``tf.convert_to_tensor(value, dtype)`` for a NumPy array, eagerly (a copy)."""
    if _to_eager is None or not tf.executing_eagerly():
        return tf.convert_to_tensor(value, dtype=dtype)
    return _to_eager(value, _context.context(), dtype)


def tape_may_record() -> bool:
    """False when no gradient tape could record an op run now (eagerly, outside any tape);
    an eager collective then skips its gradient's bookkeeping."""
    return bool(_may_record())


def in_xla_context() -> bool:
    """True while tracing a function compiled with jit_compile=True (XLA)."""
    if _cfu is None or tf.executing_eagerly():
        return False
    try:
        return bool(_cfu.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))
    except Exception:  # pragma: no cover
        return False
