"""Wait ops that hold no TensorFlow thread, for tf.compat.v1 graphs (``wait_kernel.cc``).

A tf.compat.v1 session runs each collective as a submit op and a wait op. A wait op made of
``tf.numpy_function`` holds one of the session's inter-op threads until every rank has
submitted; a run of more independent collectives than threads could stall. The
``HvdlikeWait`` kernel is asynchronous: it hands its keys to ``WaitKernel._on_wait``
and returns; once the requests behind them are complete (``Handle.add_done_callback``) the
thread ``hvdlike-tf-wait`` copies their outputs into the op's and finishes it, errors
with their TensorFlow status (``FailedPreconditionError`` when ranks disagree,
``InvalidArgumentError`` for bad input). A step cancelled meanwhile (a ``session.run``
timeout, a closed session) ends its wait ops at once with ``CancelledError`` (the session
reports ``DeadlineExceededError`` for a timeout); their requests stay with the engine and
their results are dropped.

Built on first use with the C++ compiler (``$CXX``, ``c++`` or ``g++``) against the
installed TensorFlow (about 15 s, once per TensorFlow version; see ``hvdlike.native``).
Where it cannot be built or loaded, rank 0 warns once and v1 graphs keep the
``numpy_function`` wait ops. ``HVDLIKE_TF_WAIT_KERNEL=0`` chooses those.
"""
import atexit
import ctypes
import os
import queue
import shutil
import sys
import threading
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence

import numpy as np
import tensorflow as tf

import hvdlike as _core
from hvdlike.base import native
from hvdlike.base.log import logger

SOURCE = Path(__file__).with_name("wait_kernel.cc")
_UNKNOWN = 2  # TensorFlow's status code for errors without a code of their own
_NOTIFY = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), ctypes.c_int,
                           ctypes.POINTER(ctypes.c_int), ctypes.c_int)


def build() -> str:
    """Path of the kernel library, building it on first use (``native.BuildError`` if not)."""
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or "c++"
    flags = tf.sysconfig.get_compile_flags() + tf.sysconfig.get_link_flags()
    return native.build(SOURCE, f"wait_kernel-tf{tf.__version__}", lambda source, out: [
        compiler, "-O2", "-shared", "-fPIC", "-w", source, "-o", out, *flags])


class WaitKernel:
    """The loaded kernel and the thread that finishes its ops."""

    def __init__(self, path: str, take: Callable[[int], Any],
                 outputs: Callable[[Any], List[Any]]) -> None:
        self._take, self._outputs = take, outputs
        self._ops = tf.load_op_library(path)
        lib = ctypes.CDLL(path)
        self._output = lib.hvdlike_wait_output
        self._output.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.c_int,
                                 ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p, ctypes.c_int64]
        self._finish = lib.hvdlike_wait_finish
        self._finish.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.c_char_p]
        self._done: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._notify = _NOTIFY(self._on_wait)  # kept alive as long as the kernel may call it
        lib.hvdlike_wait_set_notify(self._notify)
        # after this, a wait op fails at once instead of calling into a finished interpreter
        atexit.register(lib.hvdlike_wait_set_notify, None)
        threading.Thread(target=self._finish_forever, name="hvdlike-tf-wait",
                         daemon=True).start()

    def op(self, keys: Sequence[tf.Tensor], out_dtypes: Sequence[tf.DType],
           name: str) -> List[tf.Tensor]:
        """The outputs of one wait op for the requests behind ``keys``."""
        return list(self._ops.hvdlike_wait(keys=list(keys), Tout=list(out_dtypes), name=name))

    def _on_wait(self, waiter: int, keys: Any, n: int, dtypes: Any, n_out: int) -> None:
        """Called by a wait op on a TensorFlow thread: note what it waits for and return."""
        try:
            waits = [self._take(keys[i]) for i in range(n)]
            job = (waiter, waits, [tf.dtypes.as_dtype(dtypes[i]).as_numpy_dtype
                                   for i in range(n_out)])
            handles = [h for w in waits for h in w.handles]
        except BaseException as exc:  # an exception must not go back into TensorFlow's thread
            self._fail(waiter, exc)
            return
        if not handles:
            self._done.put(job)
            return
        left, lock = [len(handles)], threading.Lock()

        def one_done() -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                self._done.put(job)
        for handle in handles:
            handle.add_done_callback(one_done)

    def _finish_forever(self) -> None:
        while True:
            waiter, waits, dtypes = self._done.get()
            try:
                outs = [o for w in waits for o in self._outputs(w)]
                if len(outs) != len(dtypes):
                    raise RuntimeError(f"hvdlike: {len(outs)} outputs for a wait op of "
                                       f"{len(dtypes)}")
                for i, (out, dtype) in enumerate(zip(outs, dtypes)):
                    a = np.require(np.asarray(out, dtype=dtype), requirements="C")  # 0-d stays 0-d
                    dims = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
                    code = self._output(waiter, i, a.ndim, dims, a.ctypes.data, a.nbytes)
                    if code == 1:  # the step was cancelled meanwhile: results dropped
                        break
                    if code:
                        raise RuntimeError(f"hvdlike: TensorFlow took no output {i} of shape "
                                           f"{a.shape} from its wait op (code {code})")
            except BaseException as exc:
                self._fail(waiter, exc)
                continue
            self._finish(waiter, 0, None)

    def _fail(self, waiter: int, exc: BaseException) -> None:
        if isinstance(exc, tf.errors.OpError):
            code, message = exc.error_code, exc.message
        else:
            code, message = _UNKNOWN, f"{type(exc).__name__}: {exc}"
        self._finish(waiter, code, message.encode("utf-8", "replace"))


_kernel: Optional[WaitKernel] = None
_tried = False
_lock = threading.Lock()


def get(take: Callable[[int], Any],
        outputs: Callable[[Any], List[Any]]) -> Optional[WaitKernel]:
    """The kernel, built and loaded on the first call; None where it cannot be (rank 0
    warns why, once)."""
    global _kernel, _tried
    with _lock:
        if not _tried:
            _tried = True
            try:
                _kernel = WaitKernel(build(), take, outputs)
            except (native.BuildError, tf.errors.OpError, OSError) as exc:
                if _core.rank() == 0:
                    logger.warning(f"cannot use its TensorFlow wait kernel ({exc}); in "
                                   "tf.compat.v1 graphs each collective's wait op holds an "
                                   "inter-op thread until every rank has submitted it "
                                   "(docs/tensorflow.md)")
        return _kernel


def main() -> int:
    """``python -m hvdlike.tensorflow.wait_kernel``: build the kernel now (job scripts and
    container builds can do it ahead of the first job) and print its path."""
    try:
        print(build())
    except native.BuildError as exc:
        print(f"hvdlike.tensorflow.wait_kernel: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
