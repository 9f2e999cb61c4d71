"""one-off: bench_gpu with the staged path's host results in pageable (huge-page aligned)
memory instead of pinned memory; inputs stay pinned"""
import runpy, sys, types
import numpy as np
from hvdlike import buffers
from hvdlike.engine import execute_gpu
from hvdlike.transport import staged
proxy = types.SimpleNamespace(**{k: getattr(staged, k) for k in dir(staged) if not k.startswith("__")})
proxy.pinned_empty = lambda shape, dtype: buffers._aligned_empty(
    shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
execute_gpu.staging = proxy
sys.argv = ["bench_gpu.py"] + sys.argv[1:]
runpy.run_path("scripts/bench_gpu.py", run_name="__main__")
