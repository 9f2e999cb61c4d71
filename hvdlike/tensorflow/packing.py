"""Small tensors cross between a TensorFlow graph and hvdlike packed into one.

A graph all-reduce reaches the engine through a submit op and a wait op
(``tf.numpy_function``), which cost about 5-10 us per input and per output: for a model of
many small gradients (biases, norms) more than reducing them takes. So in a graph the small
tensors of each dtype cross as ONE flat tensor, concatenated in the graph before the submit
op and split back after the wait op. In Python they are views again, in their own shapes, so
the engine gets the same request (and checks it across ranks) as without packing, and its
results are packed the same way for the way back.
"""
from typing import Any, Callable, Dict, List, Sequence

import numpy as np
import tensorflow as tf

from hvdlike import ReduceOp
from hvdlike.buffers import contiguous_span
from hvdlike.engine.execute import SMALL_BYTES

# tensors below this (with a static shape) cross packed: the engine's own limit for packing
# small tensors on one node, so that they come back one after another (no copy); larger
# ones cross as they are and the engine reduces them straight from TensorFlow's memory
PACK_BYTES = SMALL_BYTES


class Packing:
    """How one all-reduce's tensors cross: ``slots[k]`` are the indices of the tensors that
    the k-th tensor crossing carries, in order (one index: the tensor as it is; more: those
    tensors flattened and concatenated). Adasum is not element-wise: nothing is packed."""

    def __init__(self, tensors: Sequence[tf.Tensor], op: ReduceOp) -> None:
        self.shapes = [tuple(t.shape.as_list()) if t.shape.is_fully_defined() else None
                       for t in tensors]
        self.sizes = [None if s is None else int(np.prod(s, dtype=np.int64))
                      for s in self.shapes]
        groups: Dict[tf.DType, List[int]] = {}
        if op != ReduceOp.ADASUM:
            for i, t in enumerate(tensors):
                if self.sizes[i] is not None and self.sizes[i] * t.dtype.size < PACK_BYTES:
                    groups.setdefault(t.dtype, []).append(i)
        packs = {g[0]: g for g in groups.values() if len(g) > 1}
        packed = {i for g in packs.values() for i in g}
        self.slots = [packs.get(i, [i]) for i in range(len(tensors))
                      if i not in packed or i in packs]

    # ------------------------------------------------------------------ graph side

    def pack(self, tensors: Sequence[tf.Tensor]) -> List[tf.Tensor]:
        """The tensors that cross, one per slot."""
        return [tensors[s[0]] if len(s) == 1 else
                tf.concat([tf.reshape(tensors[i], [-1]) for i in s], 0) for s in self.slots]

    def unpack(self, outs: Sequence[tf.Tensor]) -> List[tf.Tensor]:
        """The results in the tensors' order and shapes, from one output per slot."""
        results: List[Any] = [None] * len(self.shapes)
        for s, out in zip(self.slots, outs):
            if len(s) == 1:
                results[s[0]] = out
                continue
            for i, piece in zip(s, tf.split(out, [self.sizes[i] for i in s])):
                results[i] = tf.reshape(piece, self.shapes[i])
        return results

    # ------------------------------------------------------------------ Python side

    def views(self, arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
        """The tensors as the engine takes them, from one array per slot (views, no copy)."""
        out: List[Any] = [None] * len(self.shapes)
        for s, a in zip(self.slots, arrays):
            if len(s) == 1:
                out[s[0]] = a
                continue
            at = 0
            for i in s:
                out[i] = a[at:at + self.sizes[i]].reshape(self.shapes[i])
                at += self.sizes[i]
        return out

    def join(self, results: Sequence[np.ndarray]) -> List[np.ndarray]:
        """The engine's results, one array per slot (no copy where the engine laid a slot's
        results out one after another, as its on-node transports do)."""
        out = []
        for s in self.slots:
            if len(s) == 1:
                out.append(results[s[0]])
                continue
            pieces = [results[i] for i in s]
            span = contiguous_span(pieces)
            out.append(span if span is not None else
                       np.concatenate([p.reshape(-1) for p in pieces]))
        return out

    def joined(self, outputs: Callable[[], List[np.ndarray]]) -> Callable[[], List[np.ndarray]]:
        """``outputs`` (a wait function's), returning one array per slot."""
        return lambda: self.join(outputs())
