"""Loading a saved Keras model with its optimizer re-wrapped for hvdlike."""
from typing import Any, Dict, Optional, Sequence

from hvdlike.tensorflow import compat
from hvdlike.tensorflow.compression import Compression
from hvdlike.tensorflow.optimizer import distributed_optimizer_classes


def load_model(filepath: Any, custom_optimizers: Optional[Sequence[type]] = None,
               custom_objects: Optional[Dict[str, Any]] = None,
               compression: Any = Compression.none, legacy_opts: bool = False,
               **optimizer_kwargs: Any) -> Any:
    """Load a model saved with ``model.save`` and wrap its optimizer (state restored).

    The optimizer comes back as a DistributedOptimizer of the same class, config and
    variables (iterations, slots).  ``custom_optimizers``: your own optimizer classes
    (subclasses of the Keras optimizer), ``custom_objects``: passed to Keras.
    ``optimizer_kwargs``: other DistributedOptimizer settings (e.g. op,
    backward_passes_per_step).  Every rank may load the same file; follow with
    BroadcastGlobalVariablesCallback (or broadcast_variables) to be safe.  ``legacy_opts``
    (Horovod: use ``tf.keras.optimizers.legacy``) is accepted; the optimizer classes are
    those of the running Keras either way.
    """
    classes = distributed_optimizer_classes(custom_optimizers, compression=compression,
                                            **optimizer_kwargs)
    # tf_keras looks built-in optimizers of .h5 and SavedModel files up by lower-case name
    objs = {**{name.lower(): cls for name, cls in classes.items()}, **classes}
    objs.update(custom_objects or {})
    return compat.keras().models.load_model(filepath, custom_objects=objs)
