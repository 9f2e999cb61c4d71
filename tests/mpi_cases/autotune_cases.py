"""Autotune seen from each rank: what it applied and when, next to collectives checked
against NumPy while it changes the knobs."""
from typing import Any, Dict

import numpy as np

import hvdlike as hvd
from hvdlike import runtime


def tune(steps: int, unique: bool = False) -> Dict[str, Any]:
    """``unique``: every step's all-reduces have names of their own (no step to recognize)."""
    r, n = hvd.rank(), hvd.size()
    for step in range(steps):
        xs = [np.full(1000 * (k + 1), r + step + k, np.float32) for k in range(4)]
        handles = [hvd.allreduce_async(x, name=f"g{k}.{step}" if unique else f"g{k}", op=hvd.Sum)
                   for k, x in enumerate(xs)]
        for k, h in enumerate(handles):
            expect = sum(q + step + k for q in range(n))
            np.testing.assert_array_equal(hvd.synchronize(h), np.full(1000 * (k + 1), expect))
        # blocking calls too (a cached name: the latency path once tuning is over)
        np.testing.assert_allclose(hvd.allreduce(np.full(3, float(r)), name="blocking"),
                                   np.full(3, (n - 1) / 2))
        gathered = hvd.allgather(np.full((r + 1, 2), step, np.int64))
        np.testing.assert_array_equal(gathered, np.full((n * (n + 1) // 2, 2), step))
    tuner = runtime.state().engine.autotuner
    s = runtime.state().settings
    return dict(applied=tuner.applied, done=tuner.done,
                final=dict(fusion_threshold=s.fusion_threshold, cycle_time_ms=s.cycle_time_ms,
                           cma_threshold=s.cma_threshold))
