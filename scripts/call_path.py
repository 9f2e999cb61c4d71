"""Which of hvdlike's files a call runs code in, in order of first use: one blocking
``hvd.allreduce`` of a NumPy array, and one Keras ``fit`` step's gradient reduction.

    hvdlikerun -np 2 python scripts/call_path.py [--keras] [--json out.json]

Each case is warmed up first (the response cache knows the names), then profiled on the calling
thread with ``sys.setprofile``: every hvdlike function entered counts its file once. The Keras
step runs with ``run_eagerly=True``, so that its Python runs on the profiled thread (in a
compiled step the same reduction runs from TensorFlow's threads, the tracing once); the numbers
in docs/architecture.md come from this script. A call usually moves its data on the calling
thread; where a peer came late on some rank, the engine's thread moved it there, out of the
profile's sight, and the call is profiled again (up to ``ATTEMPTS`` times).
"""
import argparse
import json
import os
import sys
from typing import Any, Callable, Dict, List

import numpy as np

import hvdlike as hvd

ROOT = os.path.dirname(os.path.abspath(hvd.__file__))
ATTEMPTS = 10
MOVES_DATA = "transport/mpi.py"


def files_run(call: Callable[[], Any]) -> List[Dict[str, Any]]:
    """The hvdlike files (relative to the package) whose functions ``call`` enters, in order
    of first entry, each with the first function entered there."""
    seen: Dict[str, str] = {}

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        path = frame.f_code.co_filename
        if path.startswith(ROOT) and path not in seen:
            seen[path] = frame.f_code.co_name

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return [{"file": os.path.relpath(p, ROOT), "first": f} for p, f in seen.items()]


def profiled(call: Callable[[], Any]) -> List[Dict[str, Any]]:
    """``files_run(call)`` of the first attempt in which every rank's calling thread moved
    the data (each rank makes the same number of attempts)."""
    for _ in range(ATTEMPTS):
        hvd.barrier()
        files = files_run(call)
        here = any(f["file"] == MOVES_DATA for f in files)
        if hvd.allreduce(np.array([here], np.int32), op=hvd.Min, name="call_path.here")[0]:
            return files
    raise SystemExit(f"call_path.py: in {ATTEMPTS} attempts the engine's thread, not the "
                     "calling one, moved the data on some rank; is the machine loaded?")


def numpy_allreduce() -> List[Dict[str, Any]]:
    x = np.ones(4, np.float32)
    for _ in range(3):
        hvd.allreduce(x, name="call_path")
    return profiled(lambda: hvd.allreduce(x, name="call_path"))


def keras_gradient() -> List[Dict[str, Any]]:
    import hvdlike.tensorflow.keras as hvd_keras
    from hvdlike.tensorflow import compat
    keras = compat.keras()
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.01))
    model.compile(optimizer=opt, loss="mse", run_eagerly=True)
    x, y = np.ones((16, 8), np.float32), np.ones((16, 1), np.float32)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)  # warm-up: builds, names cached
    return profiled(lambda: model.train_on_batch(x, y))


def main(argv: Any = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--keras", action="store_true", help="also a Keras fit step's gradients")
    p.add_argument("--json", help="write the lists here (rank 0)")
    args = p.parse_args(argv)
    hvd.init()
    cases = {"hvd.allreduce(np_array)": numpy_allreduce()}
    if args.keras:
        cases["Keras gradient (one train step)"] = keras_gradient()
    if hvd.rank() == 0:
        for title, files in cases.items():
            print(f"{title}: {len(files)} files")
            for i, f in enumerate(files, 1):
                print(f"  {i:2d}. {f['file']} ({f['first']})")
        if args.json:
            with open(args.json, "w") as out:
                json.dump(cases, out, indent=1)


if __name__ == "__main__":
    main()
