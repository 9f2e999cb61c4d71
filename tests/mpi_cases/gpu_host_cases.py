"""The GPU API on a machine without a GPU (CI): nothing changes for host arrays."""
from typing import Any, Dict

import numpy as np

import hvdlike as hvd


def no_gpu() -> Dict[str, Any]:
    hvd.init()
    pinned = hvd.pin_gpu()
    x = np.full(4, hvd.rank() + 1, np.float32)
    return {"pinned": pinned, "nccl": hvd.nccl_built(), "cuda": hvd.cuda_built(),
            "sum": hvd.allreduce(x, op=hvd.Sum, name="host").tolist(),
            "transport": hvd.runtime.state().settings.gpu_transport}
