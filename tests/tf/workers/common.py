"""Shared setup for TF test workers: threads, init, and the CHECK reporter."""
import os
import sys
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import hvdlike.tensorflow as hvd  # noqa: E402

hvd.init()
FAILED = []
# HVDLIKE_TEST_CHECKS=name,name: run only these checks of a worker script (e.g. on the slower
# test cluster); every rank reads the same value, so the collectives still pair up
ONLY = [c for c in os.environ.get("HVDLIKE_TEST_CHECKS", "").split(",") if c]


def check(name):
    """Decorator: run the check now, print ``CHECK name rank=r OK`` or the failure."""
    def deco(fn):
        if ONLY and name not in ONLY:
            return fn
        try:
            fn()
            print(f"CHECK {name} rank={hvd.rank()} OK", flush=True)
        except Exception:  # report and continue with the next check
            FAILED.append(name)
            print(f"CHECK {name} rank={hvd.rank()} FAIL\n{traceback.format_exc()}", flush=True)
        return fn
    return deco


def close(np_mod=np):
    if FAILED:
        print(f"rank {hvd.rank()} failed: {FAILED}", flush=True)
        sys.stdout.flush()
        os._exit(1)


def assert_close(a, b, rtol=1e-6, atol=0.0, msg=""):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol, err_msg=msg)
