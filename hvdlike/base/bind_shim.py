"""The bind shim: TensorFlow's servers listen only on the address a rank publishes.

TensorFlow's gRPC server (``tf.distribute.Server``, and the servers that
MultiWorkerMirroredStrategy and ParameterServerStrategy start) listens on every interface
of its host: it binds ``0.0.0.0:PORT`` and has no option for an address. ``bind_shim.c``,
preloaded into each rank (``LD_PRELOAD``), turns a bind of the wildcard address on one
port into a bind of one address: ``export_tf_config`` sets ``HVDLIKE_TF_BIND=PORT=IP`` to
the port and address the rank publishes in ``TF_CONFIG``. In a job on one machine
``hvdlikerun`` also sets ``HVDLIKE_BIND_LOOPBACK=1``: the MPI's launcher (Open MPI's
``prterun``, which it preloads too) then binds its listeners to loopback instead of every
interface. Without those variables the shim changes nothing.

``hvdlikerun`` preloads it (Linux, with a C compiler: built once with ``cc`` into
``~/.cache/hvdlike``, or ``$XDG_CACHE_HOME/hvdlike``). Under a plain ``mpirun`` or ``srun``:
``mpirun -x LD_PRELOAD=$(python -m hvdlike.runner.bind_shim) ...``.
"""
import ctypes
import os
import shutil
from pathlib import Path
from typing import Dict, Mapping, Optional

from . import native

VARIABLE = "HVDLIKE_TF_BIND"
SOURCE = Path(__file__).with_name("bind_shim.c")


def library() -> Optional[str]:
    """The shim's shared library, built on first use; None where it cannot be (not Linux,
    no C compiler, the build failed, or no writable cache directory)."""
    if not SOURCE.is_file():
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or "cc"
    try:
        return native.build(SOURCE, "bind_shim", lambda source, out: [
            compiler, "-O2", "-shared", "-fPIC", "-o", out, source, "-ldl"], timeout=60)
    except native.BuildError:
        return None


def preload_env(env: Mapping[str, str]) -> Dict[str, str]:
    """``{"LD_PRELOAD": ...}`` with the shim in front of what ``env`` preloads, or ``{}``
    where the shim cannot be built or is preloaded already."""
    path = library()
    current = env.get("LD_PRELOAD", "")
    if path is None or path in current.replace(":", " ").split():
        return {}
    return {"LD_PRELOAD": f"{path} {current}".strip()}


def loaded() -> bool:
    """Whether the shim is loaded into this process."""
    try:
        ctypes.CDLL(None).hvdlike_bind_shim_loaded
    except AttributeError:
        return False
    return True

