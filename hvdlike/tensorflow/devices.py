"""Which device TensorFlow values live on; GPU tensors handed to the core through DLPack.

Eager collectives pass TensorFlow GPU tensors to the core as CuPy views (DLPack, no copy), so
they take the GPU path (NCCL, or staged through host memory) and come back as GPU tensors.
TensorFlow does not expose the CUDA stream its eager ops run on, so both hand-overs wait for
the device (TensorFlow's pending work before, the collective after). Inside a ``tf.function``
collectives are ``tf.numpy_function`` ops, which TensorFlow feeds from host memory.
"""
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from hvdlike.tensorflow import compat
from hvdlike.transport import gpu


def is_gpu_device(name: str) -> bool:
    """True for a TensorFlow device name on a GPU ("/job:localhost/.../device:GPU:0")."""
    return ":GPU:" in name.upper()


def on_gpu(tensor: Any) -> bool:
    """True for an eager tensor (or variable) placed on a GPU."""
    return is_gpu_device(getattr(tensor, "device", "") or "")


def to_core(tensor: Any) -> Any:
    """An eager value as the core takes it: a CuPy view of a GPU tensor, else a NumPy array
    sharing a CPU tensor's memory (``t.numpy()`` would copy it)."""
    if on_gpu(tensor) and gpu.cuda_available():
        cp = gpu.cupy()
        cp.cuda.runtime.deviceSynchronize()  # TensorFlow's own stream has finished the tensor
        return cp.from_dlpack(tf.experimental.dlpack.to_dlpack(tf.convert_to_tensor(tensor)))
    if tensor.shape.rank == 0:  # a 0-d bfloat16 tensor's __array__ gives NumPy a scalar
        return np.array(tensor.numpy())
    return np.asarray(tensor)


_SHARE_BYTES = 64 * 1024  # host results this large become tensors without a copy


def from_core(value: Any, dtype: tf.DType) -> tf.Tensor:
    """A core result as a tensor: GPU results stay on the GPU (DLPack); large host results
    on a 64-byte boundary (as the core lays them out) are shared through DLPack too, where
    ``tf.convert_to_tensor`` would copy them (24 ms for 100 MB on a 2-vCPU VM). Nothing
    else writes such an array while a tensor holds it: the core reuses a result's memory
    only once nothing refers to it (``hvdlike.engine.buffers``)."""
    if not type(value).__module__.startswith("cupy"):
        if (isinstance(value, np.ndarray) and value.nbytes >= _SHARE_BYTES
                and value.dtype.kind in "fiu" and value.dtype == dtype.as_numpy_dtype
                and value.flags.c_contiguous and value.flags.writeable
                and value.ctypes.data % 64 == 0):
            return tf.experimental.dlpack.from_dlpack(value.__dlpack__())
        return compat.eager_tensor(value, dtype)
    gpu.cupy().cuda.get_current_stream().synchronize()  # the collective has written it
    return tf.experimental.dlpack.from_dlpack(value.toDlpack())


def pin_gpu(local_rank: int) -> Optional[int]:
    """Make GPU ``local_rank`` (modulo the GPUs) TensorFlow's only visible GPU, with memory
    growth; returns its index, or None when TensorFlow sees no GPU."""
    gpus = tf.config.list_physical_devices("GPU")
    index = gpu.gpu_for(local_rank, len(gpus))
    if index is not None:
        tf.config.set_visible_devices(gpus[index], "GPU")
        tf.config.experimental.set_memory_growth(gpus[index], True)
    return index
