"""Reducing a list of gradients: shared by DistributedGradientTape, DistributedOptimizer and
MPIStrategy.

Eagerly, all dense gradients of one call go through one fused grouped allreduce per group
(one group by default).  In a graph (a compiled train step) they go in buckets of about
``HVDLIKE_OVERLAP_BUCKET`` bytes, each submitted as soon as backprop has computed it, so
communication overlaps the rest of the backward pass (see ``allreduce_gradients``).
``None`` gradients stay ``None``.
``tf.IndexedSlices`` are allgathered (values and indices) unless ``sparse_as_dense=True``.
"""
import weakref
from typing import Any, Dict, List, Optional, Sequence

import tensorflow as tf

import hvdlike as _core
from hvdlike import Adasum, Average, ProcessSet, Sum, global_process_set
from hvdlike import process_sets as _process_sets
from hvdlike import runtime as _runtime
from hvdlike.base.log import logger as _logger
from hvdlike.base.reduce_ops import as_reduce_op
from hvdlike.tensorflow import bridge, primitives
from hvdlike.tensorflow import ops as _ops
from hvdlike.tensorflow.compression import Compression, check_compression


def overlap_enabled() -> bool:
    """``HVDLIKE_OVERLAP`` (on by default), as read by ``hvd.init()``."""
    return _runtime.state("overlapping gradient reduction").settings.overlap


def buckets(sizes: Sequence[Optional[int]], cap: int) -> List[List[int]]:
    """Split positions ``0..len(sizes)-1`` (in order) into runs that each close once they
    hold ``cap`` bytes or more; a size of None (a shape not known when the graph is built)
    closes its run. ``cap`` 0: one position per run."""
    out: List[List[int]] = []
    run: List[int] = []
    held = 0
    for i, size in enumerate(sizes):
        run.append(i)
        held += cap if size is None else size
        if held >= cap:
            out.append(run)
            run, held = [], 0
    if run:
        out.append(run)
    return out


def _nbytes(t: Any) -> Optional[int]:
    n = t.shape.num_elements()
    return None if n is None else n * t.dtype.size


def backward_passes(value: Any) -> int:
    """``backward_passes_per_step`` as an int, or a ValueError saying what was wrong."""
    if int(value) < 1:
        raise ValueError("hvdlike DistributedOptimizer: backward_passes_per_step must be >= 1 "
                         f"(got {value}).")
    return int(value)


# The gradients DistributedGradientTapes returned reduced, by id, held weakly: handing them to
# a DistributedOptimizer reduces them a second time, which gets a warning.
_TAPE_RESULTS: Dict[int, Any] = {}


def remember_tape_results(inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
    """Note the gradients a DistributedGradientTape returned reduced (new tensors for
    ``inputs``)."""
    for before, after in zip(inputs, outputs):
        if after is None or after is before:
            continue
        key = id(after)
        _TAPE_RESULTS[key] = weakref.ref(after, lambda _, key=key: _TAPE_RESULTS.pop(key, None))


def _from_a_tape(gradient: Any) -> bool:
    ref = _TAPE_RESULTS.get(id(gradient))
    return ref is not None and ref() is gradient


def variable_key(v: Any) -> Any:
    """A hashable identity for a TF variable (``ref()``) or a Keras 3 variable (its id)."""
    return v.ref() if hasattr(v, "ref") else id(v)


def allreduce_gradients(tensors: List[Any], name: Optional[str],
                        process_set: _core.ProcessSet, variables: Optional[List[Any]] = None,
                        op: Any = Average, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0, compression: Any = Compression.none,
                        sparse_as_dense: bool = False) -> List[Any]:
    """Allreduce a step's gradients (dense tensors or IndexedSlices); the arguments after
    ``variables`` as for ``hvdlike.tensorflow.grouped_allreduce``.

    Eagerly every gradient exists already: one fused grouped call.  In a graph with
    ``HVDLIKE_OVERLAP`` on, the gradients, last to first (the order backprop produces them in),
    go in buckets that close at ``HVDLIKE_OVERLAP_BUCKET`` bytes (as PyTorch DDP's): one submit
    op per bucket, which TensorFlow runs (the submits are chained, in build order) as soon as
    the bucket's gradients exist; the engine fuses whatever is ready together. Buckets rather
    than one op per gradient: each op costs about 0.1 ms of Python and an engine round, which
    for a model of many small gradients cost more than its step (``docs/performance.md``).
    One wait op, fed by every submit, returns them all: it cannot start (and hold one of
    TensorFlow's threads) before backprop has produced the last gradient.  A request is named
    after its first variable (``gradient/<path>``, and ``+k`` for the k more in its bucket;
    readable in the timeline) when the ``variables`` have distinct names, else after ``name``
    and its position, else after its op.  IndexedSlices (allgathered) come after the dense
    gradients.
    """
    kwargs = dict(op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                  compression=compression, sparse_as_dense=sparse_as_dense)
    if tf.executing_eagerly() or not overlap_enabled():
        return _ops.grouped_allreduce(tensors, name=name, process_set=process_set, **kwargs)
    labels = _variable_labels(variables, len(tensors))
    names = [f"{name or 'gradient'}/{labels[i]}" if labels is not None
             else None if name is None else f"{name}/{i}" for i in range(len(tensors))]
    out: List[Any] = [None] * len(tensors)
    dense, compressed, contexts, sparse = [], [], [], []
    for i in reversed(range(len(tensors))):
        t = tensors[i]
        if isinstance(t, tf.IndexedSlices):
            if not sparse_as_dense:
                sparse.append(i)
                continue
            t = tf.convert_to_tensor(t)
        c, ctx = compression.compress(bridge.to_tensor(t, "allreduce", names[i]))
        dense.append(i)
        compressed.append(c)
        contexts.append(ctx)
    submitted = []
    cap = _runtime.state("overlapping gradient reduction").settings.overlap_bucket
    for run in buckets([_nbytes(c) for c in compressed], cap):
        first = names[dense[run[0]]]
        bucket_name = first if first is None or len(run) == 1 else f"{first}+{len(run) - 1}"
        submitted.append(primitives.allreduce_submit([compressed[k] for k in run],
                                                     as_reduce_op(op), prescale_factor,
                                                     postscale_factor, bucket_name, process_set))
    if submitted:
        for i, r, ctx in zip(dense, primitives.allreduce_wait(submitted), contexts):
            out[i] = compression.decompress(r, ctx)
    for i in sparse:
        out[i] = _ops.allreduce(tensors[i], name=names[i], process_set=process_set, **kwargs)
    return out


def _variable_labels(variables: Optional[List[Any]], n: int) -> Optional[List[str]]:
    """The variables' paths (Keras 3) or names, if there is one per gradient and no two
    are alike; else None."""
    if variables is None or len(variables) != n:
        return None
    labels = [getattr(v, "path", None) or getattr(v, "name", None) for v in variables]
    if not all(isinstance(label, str) and label for label in labels):
        return None
    return labels if len(set(labels)) == n else None


class GradientReducer:
    """Holds the reduction settings of a tape or optimizer and applies them.

    ``op``: Average, Sum or Adasum (Horovod's adaptive summation, applied to the gradients
    as Horovod's Keras optimizer does; needs 2^k ranks).  ``gradient_predivide_factor`` f:
    with op=Average the gradients are scaled by 1/f before the sum and by f/size after it
    (Horovod's semantics); the result is still the average.  ``num_groups`` splits the gradient
    list into that many fused reductions; ``groups`` is an explicit partition (a list of
    lists of variables).  ``scale_local_gradients``: kept for Horovod compatibility.
    """

    def __init__(self, compression: Any = Compression.none, sparse_as_dense: bool = False,
                 op: Any = Average, gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                 groups: Any = None, process_set: ProcessSet = global_process_set,
                 name: Optional[str] = None, owner: str = "DistributedOptimizer",
                 scale_local_gradients: bool = True) -> None:
        op = as_reduce_op(op)
        check_compression(compression, f"hvdlike.tensorflow.{owner}")
        _process_sets.require_process_set(process_set, f"hvdlike.tensorflow.{owner}")
        if op not in (Average, Sum, Adasum):
            raise ValueError(f"hvdlike.tensorflow.{owner}: op must be hvdlike.Average, "
                             f"hvdlike.Sum or hvdlike.Adasum for gradients (got {op.name}).")
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError(f"hvdlike.tensorflow.{owner}: gradient_predivide_factor is only "
                             "supported with op=Average.")
        if isinstance(groups, int) and not isinstance(groups, bool):  # Horovod: a group count
            if num_groups:
                raise ValueError(f"hvdlike.tensorflow.{owner}: pass num_groups or groups, "
                                 "not both.")
            num_groups, groups = groups, None
        if num_groups and groups is not None:
            raise ValueError(f"hvdlike.tensorflow.{owner}: pass num_groups or groups, not both.")
        if num_groups < 0:
            raise ValueError(f"hvdlike.tensorflow.{owner}: num_groups must be >= 0.")
        if groups is not None:
            if not isinstance(groups, (list, tuple)) or not all(
                    isinstance(g, (list, tuple)) for g in groups):
                raise ValueError(f"hvdlike.tensorflow.{owner}: groups must be a list of lists "
                                 "of variables (or None).")
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense
        self.op = op
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        self.num_groups = int(num_groups)
        self.groups = groups
        self.process_set = process_set
        self.name = name
        self.owner = owner
        self.scale_local_gradients = bool(scale_local_gradients)
        self.local = set()  # refs of variables whose gradients stay local
        self._warned_reduced_twice = False

    def register_local(self, variable: Any) -> None:
        """Leave ``variable``'s gradient unreduced (divided by the set size when
        ``scale_local_gradients``, as Horovod does)."""
        self.local.add(variable_key(variable))

    def is_local(self, variable: Any) -> bool:
        """Whether ``variable``'s gradient stays local (``register_local``)."""
        return variable_key(variable) in self.local

    def _local_gradient(self, g):
        if g is None or not self.scale_local_gradients:
            return g
        n = self.process_set.size()
        if isinstance(g, tf.IndexedSlices):
            return tf.IndexedSlices(g.values / n, g.indices, g.dense_shape)
        return g / n

    def _scales(self):
        f = self.gradient_predivide_factor
        if self.op == Average and f != 1.0:
            return Sum, 1.0 / f, f / self.process_set.size()
        return self.op, 1.0, 1.0

    def _partition(self, idx, variables):
        """Split the positions ``idx`` of non-None gradients into fusion groups."""
        if self.groups is not None and variables is not None:
            ref_to_group = {}
            for gi, group in enumerate(self.groups):
                for v in group:
                    ref_to_group[variable_key(v)] = gi
            parts = [[] for _ in range(len(self.groups) + 1)]
            for i in idx:
                parts[ref_to_group.get(variable_key(variables[i]), len(self.groups))].append(i)
            return [p for p in parts if p]
        if self.num_groups > 1 and len(idx) > 1:
            n = min(self.num_groups, len(idx))
            size, rem = divmod(len(idx), n)
            parts, start = [], 0
            for g in range(n):
                end = start + size + (1 if g < rem else 0)
                parts.append(idx[start:end])
                start = end
            return parts
        return [idx]

    def _reduce_single_rank(self, grads):
        """One rank: the reduction is the identity (Average and Sum agree), so skip the
        host round-trip; compression is still applied so results match np>1 rounding."""
        out = []
        for g in grads:
            if g is None:
                out.append(None)
                continue
            if isinstance(g, tf.IndexedSlices):
                if self.sparse_as_dense:
                    g = tf.convert_to_tensor(g)
                else:
                    v, ctx = self.compression.compress(g.values)
                    out.append(tf.IndexedSlices(self.compression.decompress(v, ctx),
                                                g.indices, g.dense_shape))
                    continue
            c, ctx = self.compression.compress(tf.convert_to_tensor(g))
            out.append(self.compression.decompress(c, ctx))
        return out

    def reduce(self, grads: Any, variables: Optional[Sequence[Any]] = None) -> Any:
        """Return the reduced gradients (same structure, ``None`` kept); the gradients of
        registered local variables are not reduced."""
        what = f"hvdlike.tensorflow.{self.owner}"
        _runtime.state(what)  # not initialized: an error, not gradients left local
        _process_sets.require_registered(self.process_set, what)
        grads = list(grads)
        if (self.owner != "DistributedGradientTape" and not self._warned_reduced_twice
            and any(_from_a_tape(g) for g in grads)):
            self._warned_reduced_twice = True
            _logger.warning(
                f"{what} was given gradients that a DistributedGradientTape already reduced: "
                "they are reduced a second time (sent twice; with op=Sum multiplied by the "
                "number of ranks again). Use a DistributedGradientTape with a plain "
                "optimizer, or a plain tape with the DistributedOptimizer.")
        if self.local and variables is not None:
            local = {i for i, v in enumerate(variables) if self.is_local(v)}
            if local:
                shared = [i for i in range(len(grads)) if i not in local]
                out = [self._local_gradient(g) if i in local else None
                       for i, g in enumerate(grads)]
                reduced = self._reduce([grads[i] for i in shared],
                                       [variables[i] for i in shared])
                for i, g in zip(shared, reduced):
                    out[i] = g
                return out
        return self._reduce(grads, variables)

    def _reduce(self, grads, variables=None):
        grads = list(grads)
        if not self.process_set.included():
            return grads  # as in Horovod: a rank outside the set keeps its own gradients
        if self.process_set.size() == 1:
            return self._reduce_single_rank(grads)
        op, pre, post = self._scales()
        out = list(grads)
        idx = [i for i, g in enumerate(grads) if g is not None]
        if not idx:
            return out
        parts = self._partition(idx, variables)
        # last group first: in a graph, its gradients are the first that backprop produces
        for gi, part in reversed(list(enumerate(parts))):
            name = None if self.name is None else f"{self.name}/group{gi}"
            kwargs = dict(op=op, prescale_factor=pre, postscale_factor=post,
                          compression=self.compression, sparse_as_dense=self.sparse_as_dense)
            try:
                if self.groups is not None or self.num_groups > 1:
                    reduced = _ops.grouped_allreduce([grads[i] for i in part], name=name,
                                                     process_set=self.process_set, **kwargs)
                else:
                    reduced = allreduce_gradients(
                        [grads[i] for i in part], name, self.process_set,
                        None if variables is None else [variables[i] for i in part], **kwargs)
            except tf.errors.FailedPreconditionError as e:
                raise bridge.mismatch_error(
                    f"hvdlike.tensorflow.{self.owner}: the gradients differ across ranks "
                    f"({e.message}). Every rank must produce gradients for the same variables "
                    "with the same shapes: check for gradients that are None on some ranks "
                    "only (variables not used in the loss on every rank) and for "
                    "data-dependent model structure.") from e
            for i, r in zip(part, reduced):
                out[i] = r
        return out
