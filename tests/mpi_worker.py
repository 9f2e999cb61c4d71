"""Runs one test function on one rank: ``mpi_worker.py module:function outdir``.

Used only through ``mpi_harness.run_mpi``. The function's return value is pickled to
``outdir/rank{R}.pkl``; an exception propagates (and hvdlike aborts the job).
"""
import importlib
import pickle
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "mpi_cases"))

import hvdlike as hvd  # noqa: E402


def main() -> None:
    target, outdir = sys.argv[1], Path(sys.argv[2])
    module_name, function_name = target.split(":")
    function = getattr(importlib.import_module(module_name), function_name)
    kwargs = pickle.loads((outdir / "kwargs.pkl").read_bytes())
    hvd.init()
    result = function(**kwargs)
    (outdir / f"rank{hvd.rank()}.pkl").write_bytes(pickle.dumps(result))
    hvd.shutdown()


if __name__ == "__main__":
    main()
