"""DistributedOptimizer for Keras 3 optimizers (and tf_keras with TF_USE_LEGACY_KERAS=1).

``DistributedOptimizer(opt)`` returns a new optimizer of a subclass of ``type(opt)``
built from ``opt.get_config()``; the subclass (``optimizer_classes``) reduces the gradients
across ranks (one fused allreduce per step) before the wrapped class applies them, so
clipping, weight decay, loss scaling and EMA all see the averaged gradient. Importing this
module applies ``keras_patches``.
"""
from typing import Any, Dict, Optional, Sequence

import tensorflow as tf

from hvdlike import Average, ProcessSet, global_process_set
from hvdlike.tensorflow import compat, keras_patches, optimizer_v1
from hvdlike.tensorflow.compression import Compression
from hvdlike.tensorflow.gradients import GradientReducer
from hvdlike.tensorflow.optimizer_classes import distributed_class, is_distributed_optimizer

keras_patches.install()

__all__ = ["DistributedOptimizer", "PartialDistributedOptimizer", "distributed_optimizer_classes",
           "is_distributed_optimizer"]


def _check_optimizer(optimizer):
    bases = compat.optimizer_base_classes()
    if not isinstance(optimizer, bases):
        kind = "tf_keras (TF_USE_LEGACY_KERAS=1)" if compat.use_legacy_keras() else "Keras 3"
        other = ""
        if isinstance(optimizer, tf.Module) or "keras" in type(optimizer).__module__:
            other = (" If this is an optimizer from the other Keras flavour, set or unset "
                     "TF_USE_LEGACY_KERAS=1 before importing TensorFlow so both agree.")
        raise TypeError(
            f"hvdlike DistributedOptimizer expects a {kind} optimizer (an instance of "
            f"{', '.join(b.__module__ + '.' + b.__name__ for b in bases)}), got "
            f"{type(optimizer).__module__}.{type(optimizer).__name__}. Create it with "
            "keras.optimizers (e.g. keras.optimizers.SGD(0.01)); a tf.compat.v1.train "
            "optimizer works too; for custom training loops with other optimizers use "
            f"hvdlike.tensorflow.DistributedGradientTape.{other}")


def DistributedOptimizer(optimizer: Any, name: Optional[str] = None, device_dense: str = "",
                         device_sparse: str = "", compression: Any = Compression.none,
                         sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                         op: Any = Average, backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: Any = None,
                         process_set: ProcessSet = global_process_set,
                         scale_local_gradients: bool = True, use_locking: bool = False) -> Any:
    """Wrap a Keras optimizer so that every step applies gradients reduced over ranks.

    Every rank wraps an optimizer of the same class and config with the same settings.
    Returns a new optimizer (subclass of ``type(optimizer)``, same config); the
    original is not modified.  Gradients of one step go through one fused allreduce
    (``num_groups`` > 1 or ``groups`` split it into several).  ``op``: Average (default),
    Sum or Adasum (the gradients combined by Horovod's adaptive summation; 2^k ranks, and
    the learning rate is not scaled by the number of ranks).  ``compression``:
    Compression.none / fp16 / bf16 on the wire.
    ``backward_passes_per_step`` k: gradients are summed locally for k calls, then
    reduced once and applied (divided by k first if ``average_aggregated_gradients``);
    ``optimizer.iterations`` counts applied updates.  Mixed precision: a
    ``LossScaleOptimizer`` may sit inside (``DistributedOptimizer(LossScaleOptimizer(opt))``)
    or outside (``LossScaleOptimizer(DistributedOptimizer(opt))``, which is also what
    ``model.compile`` builds under a ``mixed_float16`` policy); either way every rank makes
    the same skip-or-apply decision.  ``groups`` may also be a number of groups, as in
    Horovod.  ``optimizer.register_local_var(v)`` keeps ``v``'s gradient local (divided by
    the set size when ``scale_local_gradients``).  ``device_*`` are accepted for Horovod
    compatibility and have no effect.

    A ``tf.compat.v1.train.Optimizer`` (Horovod's TF1 API: ``minimize``, or
    ``compute_gradients`` and ``apply_gradients``, in a graph or eagerly) is wrapped too:
    its ``compute_gradients`` returns the reduced gradients; ``use_locking`` goes to the
    wrapper; with ``backward_passes_per_step`` k > 1 it sums gradients locally and applies
    them reduced on every k-th pass (``global_step`` still counts every pass).  With
    ``op=Adasum`` each rank applies its own gradients and every k-th pass the variables'
    changes since the last such pass are combined by Adasum, as in Horovod's TF1 optimizer.
    See ``BroadcastGlobalVariablesHook``.
    """
    if is_distributed_optimizer(optimizer):
        raise ValueError("hvdlike DistributedOptimizer: this optimizer is already distributed;"
                         " wrap the original optimizer only once.")
    if optimizer_v1.is_v1_optimizer(optimizer):
        return optimizer_v1.distributed_v1(
            optimizer, use_locking, backward_passes_per_step, average_aggregated_gradients,
            compression=compression,
            sparse_as_dense=sparse_as_dense, op=op,
            gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups,
            groups=groups, process_set=process_set, name=name,
            scale_local_gradients=scale_local_gradients)
    _check_optimizer(optimizer)
    if getattr(optimizer, "built", False) and getattr(optimizer, "variables", None):
        raise ValueError(
            "hvdlike DistributedOptimizer: the optimizer already has state (it was built or "
            "used). Wrap a fresh optimizer before compile/first step, or restore the model "
            "with hvdlike.keras.load_model, which re-creates the wrapped optimizer with its "
            "state.")
    settings = dict(compression=compression, sparse_as_dense=sparse_as_dense,
                    gradient_predivide_factor=gradient_predivide_factor, op=op,
                    backward_passes_per_step=backward_passes_per_step,
                    average_aggregated_gradients=average_aggregated_gradients,
                    num_groups=num_groups, groups=groups, process_set=process_set,
                    scale_local_gradients=scale_local_gradients, name=name)
    # Validate settings once, with a clear error, before building the class.
    GradientReducer(compression=compression, sparse_as_dense=sparse_as_dense, op=op,
                    gradient_predivide_factor=gradient_predivide_factor,
                    num_groups=num_groups, groups=groups, process_set=process_set)
    cls = distributed_class(type(optimizer), settings)
    return cls.from_config(optimizer.get_config())


def distributed_optimizer_classes(custom_optimizers: Optional[Sequence[type]] = None,
                                  **settings: Any) -> Dict[str, type]:
    """``{class name: distributed subclass}`` for load_model's custom_objects."""
    k = compat.keras()
    bases = compat.optimizer_base_classes()
    found = {}
    for attr in dir(k.optimizers):
        obj = getattr(k.optimizers, attr)
        if isinstance(obj, type) and issubclass(obj, bases) and obj not in bases:
            found[obj.__name__] = obj
    for obj in custom_optimizers or []:
        found[obj.__name__] = obj
    return {n: distributed_class(c, settings) for n, c in found.items()}


def PartialDistributedOptimizer(optimizer: Any, name: Optional[str] = None,
                                device_dense: str = "", device_sparse: str = "",
                                compression: Any = Compression.none,
                                sparse_as_dense: bool = False,
                                gradient_predivide_factor: float = 1.0, op: Any = Average,
                                backward_passes_per_step: int = 1,
                                average_aggregated_gradients: bool = False, groups: Any = None,
                                process_set: ProcessSet = global_process_set,
                                local_layers: Any = None, scale_local_gradients: bool = True,
                                use_locking: bool = False) -> Any:
    """``DistributedOptimizer`` whose ``local_layers``' gradients stay local (not reduced;
    divided by the set size when ``scale_local_gradients``), as Horovod's."""
    from hvdlike.tensorflow.tape import _layer_variables

    local = _layer_variables(local_layers, "PartialDistributedOptimizer")
    opt = DistributedOptimizer(optimizer, name, device_dense, device_sparse, compression,
                               sparse_as_dense, gradient_predivide_factor, op,
                               backward_passes_per_step, average_aggregated_gradients,
                               groups=groups, process_set=process_set,
                               scale_local_gradients=scale_local_gradients)
    for v in local:
        opt.register_local_var(v)
    return opt
