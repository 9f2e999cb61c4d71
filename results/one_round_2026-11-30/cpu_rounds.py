import os, sys, time
sys.path.insert(0, "/work/main/scripts")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np, tensorflow as tf
import hvdlike as core
import hvdlike.keras as hvd
import hvdlike.tensorflow as hvd_tf
from hvdlike.tensorflow.compat import keras as _keras
from bench_train import build_model, tape_loop
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)
keras = _keras()
hvd.init()
dist = sys.argv[1] == "d"
rng = np.random.RandomState(hvd.rank())
x = rng.uniform(size=(64, 28, 28, 1)).astype(np.float32)
y = rng.randint(0, 10, size=(64,)).astype(np.int64)
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
model = build_model(keras, "mlp", (28, 28, 1), 10)
opt = keras.optimizers.SGD(0.01, momentum=0.9)
run = tape_loop(tf, hvd_tf, model, opt, loss, dist, x, y)
run(20)
open(f"/tmp/probe/pid{hvd.rank()}", "w").write(str(os.getpid()))
import glob, threading
def cpu():
    out = {}
    names = {t.native_id: t.name for t in threading.enumerate()}
    for d in glob.glob(f"/proc/{os.getpid()}/task/*"):
        tid = int(d.rsplit("/", 1)[1])
        try:
            st = open(d + "/stat").read().rsplit(")", 1)[1].split()
            comm = open(d + "/comm").read().strip()
        except OSError: continue
        out[tid] = (names.get(tid, comm), (int(st[11]) + int(st[12])) / os.sysconf("SC_CLK_TCK"))
    return out
core.barrier()
import hvdlike.runtime as _rt
_e = _rt._state.engine
_cnt = {"resp": 0, "prod": 0, "busy_after": 0}
_orig = _e._run_responses
def _rr(responses, ready):
    _cnt["prod"] += 1; _cnt["resp"] += len(responses)
    return _orig(responses, ready)
_e._run_responses = _rr
_oc = _e._conclude
def _conc(rows, announce, fresh):
    _cnt["w%d" % rows.waiting] = _cnt.get("w%d" % rows.waiting, 0) + 1
    return _oc(rows, announce, fresh)
_e._conclude = _conc
import hvdlike.runtime as _rt; eng = _rt._state.engine; r0 = eng._round_no; c0 = cpu(); t0 = time.perf_counter(); n = int(sys.argv[2]); run(n); wall = time.perf_counter() - t0; c1 = cpu(); print(hvd.rank(), "rounds per step", (eng._round_no - r0) / n, "productive", _cnt["prod"] / n, "responses", _cnt["resp"] / n, "direct", eng.direct_runs, {k: v / n for k, v in _cnt.items() if k.startswith("w")}, flush=True)
d = sorted(((c1[t][1] - c0.get(t, (0, 0))[1], c1[t][0]) for t in c1), reverse=True)
tot = sum(x for x, _ in d)
print(hvd.rank(), sys.argv[1], "ms/step %.2f  cpu ms/step %.2f  " % (1e3 * wall / n, 1e3 * tot / n) + "  ".join("%s:%.2f" % (nm, 1e3 * x / n) for x, nm in d[:6] if x > 0), flush=True)
