"""DistributedGradientTape: a tf.GradientTape whose gradient() averages across ranks."""
from typing import Any

import tensorflow as tf

from hvdlike import Average, ProcessSet, global_process_set
from hvdlike.tensorflow import compat
from hvdlike.tensorflow.compression import Compression
from hvdlike.tensorflow.gradients import GradientReducer, remember_tape_results


class _DistributedGradientTape(tf.GradientTape):
    """Shares the recording state of the wrapped tape; only ``gradient`` differs."""

    def __init__(self, tape, reducer):  # noqa: D401 - state is copied, not re-created
        self.__dict__.update(tape.__dict__)
        self._hvd_reducer = reducer

    def register_local_source(self, source):
        """Keep ``source``'s gradient local: not reduced over ranks (divided by the set size
        when ``scale_local_gradients``), as Horovod's ``register_local_source``."""
        self._hvd_reducer.register_local(source)

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        grads = super().gradient(target, sources, output_gradients=output_gradients,
                                 unconnected_gradients=unconnected_gradients)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        reduced = self._hvd_reducer.reduce(flat_grads, flat_sources)
        shared = [i for i, s in enumerate(flat_sources) if not self._hvd_reducer.is_local(s)]
        remember_tape_results([flat_grads[i] for i in shared], [reduced[i] for i in shared])
        return tf.nest.pack_sequence_as(grads, reduced)

    def get_local_and_global_gradients(self, target, sources, output_gradients=None):
        """Horovod's: ``gradient``'s results as two lists of ``(source, gradient)``:
        the sources whose gradients stay local, then the others."""
        sources = tf.nest.flatten(sources)
        local, shared = [], []
        for source, grad in zip(sources, self.gradient(target, sources, output_gradients)):
            (local if self._hvd_reducer.is_local(source) else shared).append((source, grad))
        return local, shared


def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                            device_sparse: str = "", compression: Any = Compression.none,
                            sparse_as_dense: bool = False, op: Any = Average,
                            gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                            groups: Any = None,
                            process_set: ProcessSet = global_process_set,
                            scale_local_gradients: bool = True) -> tf.GradientTape:
    """Wrap a ``tf.GradientTape`` so that ``gradient()`` returns gradients reduced over ranks.

    Use it after recording (``tape = hvd.DistributedGradientTape(tape)``) or around a
    fresh tape (``with hvd.DistributedGradientTape(tf.GradientTape()) as tape``).
    Every rank must call ``gradient`` for the same sources.  All dense gradients of one
    call are reduced in one fused allreduce (``num_groups``/``groups`` split it);
    ``None`` gradients stay ``None`` (they must be ``None`` on every rank).
    ``op``: Average (default), Sum or Adasum.  See ``GradientReducer`` for the rest.
    """
    if not isinstance(gradtape, tf.GradientTape):
        raise TypeError("hvdlike.tensorflow.DistributedGradientTape expects a "
                        f"tf.GradientTape, got {type(gradtape).__name__}.")
    reducer = GradientReducer(compression=compression, sparse_as_dense=sparse_as_dense, op=op,
                              gradient_predivide_factor=gradient_predivide_factor,
                              num_groups=num_groups, groups=groups, process_set=process_set,
                              owner="DistributedGradientTape",
                              scale_local_gradients=scale_local_gradients)
    return _DistributedGradientTape(gradtape, reducer)


def _layer_variables(local_layers, owner):
    layer_class = compat.keras().layers.Layer
    if local_layers is None:
        return []
    if isinstance(local_layers, layer_class):
        local_layers = [local_layers]
    if not all(isinstance(layer, layer_class) for layer in local_layers):
        raise ValueError(f"hvdlike.tensorflow.{owner}: local_layers must be Keras layers.")
    return [v for layer in local_layers for v in layer.trainable_weights]


def PartialDistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                                   device_sparse: str = "",
                                   compression: Any = Compression.none,
                                   sparse_as_dense: bool = False, op: Any = Average,
                                   gradient_predivide_factor: float = 1.0,
                                   num_groups: int = 0, groups: Any = None,
                                   process_set: ProcessSet = global_process_set,
                                   local_layers: Any = None,
                                   scale_local_gradients: bool = True) -> tf.GradientTape:
    """``DistributedGradientTape`` whose ``local_layers``' gradients stay local (not reduced;
    divided by the set size when ``scale_local_gradients``), as Horovod's."""
    local = _layer_variables(local_layers, "PartialDistributedGradientTape")
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, scale_local_gradients)
    for v in local:
        tape.register_local_source(v)
    return tape
