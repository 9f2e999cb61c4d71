"""GPU arrays in the core: which inputs live on a GPU, CuPy and NCCL loaded on demand, and the
CUDA stream ordering between the caller and the engine.

An input is a GPU array when it is a CuPy array or any object whose ``__dlpack_device__`` says
CUDA (PyTorch CUDA tensors, JAX GPU arrays, ...). Such inputs are viewed as CuPy arrays through
DLPack, without a copy, and results come back as the caller's kind (a PyTorch tensor for a
PyTorch tensor, through ``torch.from_dlpack``; a CuPy array otherwise). Nothing here imports
CuPy until a GPU array is seen, so ``import hvdlike`` stays fast on machines without one.

Streams: an async call's collective runs on the engine's own stream for the device, after an
event recorded on the caller's current CuPy stream at submission, so it overlaps with what the
caller enqueues next; a blocking call's runs on the caller's stream itself. ``synchronize()``
makes the caller's current stream wait for the event recorded after the collective. No host
synchronization is involved on the NCCL path.
"""
import ctypes
import functools
import glob
import importlib
import importlib.util
import os
import sys
import threading
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

_DLPACK_CUDA = (2, 13)  # kDLCUDA, kDLCUDAManaged (kDLCUDAHost, pinned, counts as host)

NCCL_PACKAGES = "cupy-cuda12x and nvidia-nccl-cu12 (pip install 'hvdlike[gpu]'; CUDA 13: " \
                "'hvdlike[gpu-cu13]')"


# ----------------------------------------------------------------------------- which inputs

def is_device_array(x: Any) -> bool:
    """True when ``x`` lives in GPU memory (CuPy array, or a DLPack object on CUDA)."""
    if type(x).__module__.startswith("cupy"):
        return hasattr(x, "data") and hasattr(x, "device")
    probe = getattr(x, "__dlpack_device__", None)
    if probe is None or isinstance(x, np.ndarray):
        return False
    try:
        kind = int(probe()[0])
    except Exception:  # noqa: BLE001 - an object that cannot say where it lives is not ours
        return False
    return kind in _DLPACK_CUDA


def device_kind(xs: Sequence[Any]) -> Tuple[str, Optional[str]]:
    """("gpu" or "cpu", None) for inputs that all live on one side, or ("cpu", why) when a
    grouped call mixes host and GPU arrays."""
    on_gpu = [is_device_array(x) for x in xs]
    if not any(on_gpu):
        return "cpu", None
    if all(on_gpu):
        return "gpu", None
    where = ", ".join(f"{i}: {'gpu' if g else 'host'}" for i, g in enumerate(on_gpu))
    return "cpu", ("grouped collectives take arrays that all live on the host or all on a GPU, "
                   f"got a mix ({where}); make one call per device")


_cupy: List[Any] = []


def cupy() -> Any:
    """The CuPy module, with NCCL's library from the nvidia-nccl wheel loaded first."""
    if not _cupy:
        _preload_nccl_wheel()
        _cupy.append(importlib.import_module("cupy"))
    return _cupy[0]


class DeviceInput(NamedTuple):
    array: Any  # a C-contiguous CuPy array sharing the input's memory
    restore: Callable[[Any], Any]  # CuPy result -> the caller's kind of array


def as_cupy(x: Any) -> DeviceInput:
    """View a GPU array as a contiguous CuPy array (DLPack, no copy when already contiguous)."""
    cp = cupy()
    restore: Callable[[Any], Any]
    if isinstance(x, cp.ndarray):
        a, restore = x, _same
    else:
        a, restore = cp.from_dlpack(x), _restorer(type(x))  # type: ignore[arg-type]
    if not a.flags.c_contiguous:
        a = cp.ascontiguousarray(a)
    return DeviceInput(a, restore)


def _same(a: Any) -> Any:
    return a


@functools.lru_cache(maxsize=32)
def _restorer(kind: type) -> Callable[[Any], Any]:
    """How to turn a CuPy result into an array of the caller's library: its top-level module's
    ``from_dlpack`` (torch.from_dlpack, jax.dlpack.from_dlpack...), else the CuPy array."""
    top = sys.modules.get(kind.__module__.split(".")[0])
    convert = getattr(top, "from_dlpack", None) or getattr(getattr(top, "dlpack", None),
                                                         "from_dlpack", None)
    return convert if callable(convert) else _same


# ----------------------------------------------------------------------------- availability

def _wheel_nccl_library() -> Optional[str]:
    """libnccl.so.2 from the nvidia-nccl-cu1x wheel, if installed."""
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        found = sorted(glob.glob(os.path.join(root, "nccl", "lib", "libnccl.so*")))
        if found:
            return found[0]
    return None


_preloaded: List[bool] = []


def _preload_nccl_wheel() -> None:
    """Load the wheel's NCCL globally before CuPy's NCCL module, so that CuPy finds it by its
    soname without LD_LIBRARY_PATH. A system NCCL already on the loader's path also works."""
    if _preloaded:
        return
    _preloaded.append(True)
    path = _wheel_nccl_library()
    if path is not None:
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            pass  # CuPy then tries the loader's path and reports what is missing


def cuda_available() -> bool:
    """True when CuPy imports and sees at least one GPU."""
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        return cupy().cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no driver, no device: no CUDA
        return False


def nccl_module() -> Any:
    """CuPy's NCCL bindings, or ImportError naming what to install."""
    if importlib.util.find_spec("cupy") is None:
        raise ImportError(f"hvdlike's NCCL transport needs CuPy and NCCL: install {NCCL_PACKAGES}")
    cupy()
    try:
        from cupy.cuda import nccl
    except ImportError as exc:
        raise ImportError(f"CuPy is installed but its NCCL bindings did not load ({exc}); "
                          f"install {NCCL_PACKAGES}") from None
    if not getattr(nccl, "available", True):
        raise ImportError(f"CuPy is installed but found no NCCL library; install {NCCL_PACKAGES}")
    return nccl


def nccl_available() -> bool:
    try:
        nccl_module()
        return True
    except ImportError:
        return False


# ----------------------------------------------------------------------------- streams

class OnDevice(NamedTuple):
    """A GPU request's inputs as the engine gets them: the collective's usual inputs (CuPy
    arrays in place of NumPy ones) and how to order its work after the caller's."""

    inputs: Any
    ready: Any  # async call: an event recorded on the caller's stream at submission
    stream: Any  # blocking call: the caller's stream, where its work then runs (no events)


def submitted(inputs: Any, blocking: bool) -> OnDevice:
    """``inputs`` as submitted from the caller's current stream. A blocking call's work runs
    on that stream (the caller enqueues nothing meanwhile: no event, no overlap to win); an
    async call's runs on the engine's stream, after an event recorded here."""
    stream = cupy().cuda.get_current_stream()
    if blocking:
        return OnDevice(inputs, None, stream)
    event = cupy().cuda.Event(block=False, disable_timing=True, interprocess=False)
    event.record(stream)
    return OnDevice(inputs, event, None)


class DeviceResult(NamedTuple):
    """What the engine hands back for a GPU request: the result (CuPy arrays), the event
    recorded on the engine's stream after it, and the inputs, kept alive until then."""

    value: Any
    done: Any  # cupy.cuda.Event, or None when the work ran on the caller's stream
    inputs: Any


def finisher(restore: Callable[[Any], Any]) -> Callable[[DeviceResult], Any]:
    """What ``synchronize()`` applies to a GPU result, on the caller's thread: order the
    caller's current stream after the collective, then return the caller's kind of arrays."""
    def finish(result: DeviceResult) -> Any:
        if result.done is not None:
            cupy().cuda.get_current_stream().wait_event(result.done)
        return _map_arrays(result.value, restore)
    return finish


def _map_arrays(value: Any, fn: Callable[[Any], Any]) -> Any:
    if isinstance(value, list):
        return [_map_arrays(v, fn) for v in value]
    if isinstance(value, tuple):  # alltoall: (received, splits on the host)
        return tuple(v if isinstance(v, np.ndarray) else _map_arrays(v, fn) for v in value)
    return fn(value)


_streams: Dict[int, Any] = {}
_streams_lock = threading.Lock()


def engine_stream(device_id: int) -> Any:
    """The engine's own non-blocking stream on ``device_id``, made once."""
    with _streams_lock:
        stream = _streams.get(device_id)
        if stream is None:
            cp = cupy()
            with cp.cuda.Device(device_id):
                stream = _streams[device_id] = cp.cuda.Stream(non_blocking=True)
        return stream


def gpu_for(local_rank: int, gpus: int) -> Optional[int]:
    """The GPU a rank with ``local_rank`` should use among ``gpus`` visible ones: its local rank
    (ranks beyond the GPU count share them round-robin), or None without GPUs."""
    if gpus <= 0:
        return None
    return local_rank % gpus


def use_gpu(local_rank: int) -> Optional[int]:
    """Make GPU ``local_rank`` (modulo the GPUs visible) CuPy's current device; returns its
    index, or None when CuPy is missing or sees no GPU (nothing is changed then)."""
    if not cuda_available():
        return None
    cp = cupy()
    index = gpu_for(local_rank, cp.cuda.runtime.getDeviceCount())
    cp.cuda.Device(index).use()
    return index
