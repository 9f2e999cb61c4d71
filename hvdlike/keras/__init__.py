"""``hvdlike.keras`` is ``hvdlike.tensorflow.keras`` (like ``horovod.keras``)."""
import hvdlike.tensorflow.keras as _impl
from hvdlike.tensorflow.keras import *  # noqa: F401,F403
from hvdlike.keras import callbacks  # noqa: F401

globals().update({k: v for k, v in vars(_impl).items()
                  if not k.startswith("_") and k != "callbacks"})
