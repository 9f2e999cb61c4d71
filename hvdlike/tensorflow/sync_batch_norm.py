"""SyncBatchNormalization: batch normalization over the global batch (every rank's samples)."""
from typing import Any, Optional, Sequence

import tensorflow as tf

from hvdlike import Sum, global_process_set
from hvdlike.tensorflow import compat
from hvdlike.tensorflow import ops as _ops


def global_moments(x: tf.Tensor, axes: Sequence[int], keepdims: bool,
                   weights: Optional[tf.Tensor] = None,
                   process_set: Any = global_process_set) -> Any:
    """Mean and variance of ``x`` over ``axes`` and over every rank of ``process_set``: each
    rank's sums (of x, of x², of the sample weights) travel in one all-reduce, so ranks with
    different batch sizes count by their samples. 16-bit inputs are summed in float32."""
    dtype = x.dtype
    y = tf.cast(x, tf.float32) if dtype in (tf.float16, tf.bfloat16) else x
    axes = list(axes)
    if weights is None:
        count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(y), axes)), y.dtype)
        total = tf.reduce_sum(y, axes, keepdims=True)
        squares = tf.reduce_sum(tf.square(y), axes, keepdims=True)
        counts = tf.ones_like(total) * count
    else:
        w = tf.cast(tf.broadcast_to(weights, tf.shape(y)), y.dtype)
        total = tf.reduce_sum(y * w, axes, keepdims=True)
        squares = tf.reduce_sum(tf.square(y) * w, axes, keepdims=True)
        counts = tf.reduce_sum(w, axes, keepdims=True)
    summed = _ops.allreduce(tf.stack([total, squares, counts]), op=Sum, process_set=process_set)
    mean = summed[0] / summed[2]
    variance = tf.maximum(summed[1] / summed[2] - tf.square(mean), 0.0)
    if not keepdims:
        mean, variance = tf.squeeze(mean, axes), tf.squeeze(variance, axes)
    return tf.cast(mean, dtype), tf.cast(variance, dtype)


class SyncBatchNormalization(compat.keras().layers.BatchNormalization):
    """``BatchNormalization`` whose training statistics are those of the global batch: every
    rank's sums are all-reduced in each training call (one all-reduce per layer), so the
    result equals one process normalizing the concatenation of every rank's batch (ranks may
    have different batch sizes). Inference uses the moving statistics, which every rank
    updates alike. Every rank must call the layer, in the same order. Horovod's name and
    signature (``fused=False`` is taken in either Keras flavour, as Horovod scripts pass it);
    also ``process_set=`` to normalize over a process set."""

    def __init__(self, *args: Any, fused: Optional[bool] = False,
                 process_set: Any = global_process_set, **kwargs: Any) -> None:
        if fused is not False:
            raise ValueError(f"hvdlike SyncBatchNormalization: fused={fused!r} is not "
                             "supported: the fused kernel computes each rank's own statistics. "
                             "Leave fused out or pass fused=False.")
        if compat.use_legacy_keras():  # Keras 3 has no fused kernel and no such argument
            kwargs["fused"] = False
        super().__init__(*args, **kwargs)
        self._hvd_process_set = process_set

    def _moments(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        if compat.use_legacy_keras():  # tf_keras: (inputs, reduction_axes, keep_dims, mask)
            names = ("reduction_axes", "keep_dims", "mask")
            given = dict(zip(names, args), **kwargs)
            mask = given.get("mask")
            weights = None if mask is None else tf.expand_dims(tf.cast(mask, inputs.dtype), -1)
            return global_moments(inputs, given["reduction_axes"], given["keep_dims"], weights,
                                  self._hvd_process_set)
        mask = args[0] if args else kwargs.get("mask")  # Keras 3: (inputs, mask)
        weights = None if mask is None else tf.expand_dims(tf.cast(mask, inputs.dtype), -1)
        return global_moments(inputs, self._reduction_axes, False, weights,
                              self._hvd_process_set)
