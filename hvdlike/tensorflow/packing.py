"""Small tensors cross between a TensorFlow graph and hvdlike packed into one.

A graph all-reduce reaches the engine through a submit op and a wait op
(``tf.numpy_function``), which cost about 5-10 us per input and per output, and the engine
has a cost per array of a few microseconds more: for a model of many small gradients
(biases, norms) more than reducing them takes. So in a graph the small tensors of each dtype
cross as ONE flat tensor, concatenated in the graph before the submit op and split back
after the wait op, and the engine reduces it as one array. Its request still names every
tensor's shape (``parts``: ``Request.parts``), so the ranks are checked tensor by tensor as
without packing.
"""
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from hvdlike import ReduceOp

# tensors below this (with a static shape) cross packed: copying one in and out costs less
# than its crossing and its array in the engine (a hot 64 KiB copy takes ~1.6 us); larger
# ones cross as they are and the engine reduces them straight from TensorFlow's memory
PACK_BYTES = 64 * 1024


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
        # the engine request's parts: per crossing tensor, the shapes it carries
        self.parts: Optional[Tuple[Any, ...]] = tuple(
            None if len(s) == 1 else tuple(self.shapes[i] for i in s)
            for s in self.slots) if packs else None

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
