"""Gradient compression applied around a reduction (same names as Horovod).

A compressor has ``compress(tensor) -> (tensor, ctx)`` and
``decompress(tensor, ctx) -> tensor``.  Only floating-point tensors are compressed;
integers and already-small floats pass through unchanged.
"""
from typing import Any

import tensorflow as tf


class Compressor:
    """Interface for compressing and decompressing a tensor."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


def _cast_compressor(target, name):
    class _Cast(Compressor):
        __doc__ = f"Send 32/64-bit floating-point tensors as {target.name} (cast back after)."

        @staticmethod
        def compress(tensor):
            if tensor.dtype.is_floating and tensor.dtype != target:
                return tf.cast(tensor, target), tensor.dtype
            return tensor, None

        @staticmethod
        def decompress(tensor, ctx):
            return tensor if ctx is None else tf.cast(tensor, ctx)

    _Cast.__name__ = _Cast.__qualname__ = name
    return _Cast


FP16Compressor = _cast_compressor(tf.float16, "FP16Compressor")
BF16Compressor = _cast_compressor(tf.bfloat16, "BF16Compressor")


class Compression:
    """Available compressors: ``Compression.none``, ``Compression.fp16``, ``Compression.bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


def check_compression(compression: Any, what: str) -> Any:
    """``compression`` when it has ``compress`` and ``decompress``; else a TypeError naming
    ``what`` (e.g. "hvdlike.tensorflow.allreduce")."""
    if callable(getattr(compression, "compress", None)) and \
            callable(getattr(compression, "decompress", None)):
        return compression
    raise TypeError(f"{what}: compression= takes hvdlike.tensorflow.Compression.none, .fp16 or "
                    ".bf16 (or an object with compress(tensor) and decompress(tensor, ctx)), "
                    f"got {type(compression).__name__} {compression!r}")
