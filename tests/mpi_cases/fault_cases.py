"""A job whose ranks on one host meet a fault in the middle of training (tests/test_watchdog.py
on one host, tests/test_cluster.py across the test hosts).

``fault_cases.py FAULT FOLDER [LINK]``: each rank all-reduces a 1 MiB gradient a step, or,
with ``HVDLIKE_TEST_FIT=1``, trains a small Keras model with ``fit`` and
``DistributedOptimizer``. At step ``FAULT_STEP`` the ranks of the last host (the faulty ones;
on one host, its last rank) do FAULT:

- ``link``: the first of them sets the host's link LINK down (``ip link set LINK down``);
- ``frozen``: each stops itself (SIGSTOP);
- ``killed``: each kills itself (SIGKILL);
- ``busy``: the last rank spins in a Python loop for ``HVDLIKE_TEST_BUSY_SECONDS``, then
  trains on; the job must complete;
- ``link-then-sigterm``: as ``link``, and 3 s later rank 0 sends SIGTERM to the
  ``hvdlikerun`` that started the job (its launcher's parent), as a batch system would.

The faulty ranks write the time of the fault to ``FOLDER/fault.txt`` (the output of a host
that lost its link never arrives); every rank that finishes prints ``DONE rank=<r> <sum>``.
"""
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np

import hvdlike as hvd

FAULT_STEP = 20
STEPS = 60


def fault(kind: str, folder: str, link: str, faulty: list) -> None:
    if kind == "link-then-sigterm":
        if hvd.rank() == 0:
            threading.Timer(3.0, os.kill, (_parent(_parent(os.getpid())), signal.SIGTERM)).start()
        kind = "link"
    if hvd.rank() not in faulty:
        return
    first = hvd.rank() == faulty[0]
    if kind == "busy":
        if hvd.rank() != faulty[-1]:
            return
        with open(os.path.join(folder, "fault.txt"), "w") as f:
            f.write(f"{time.time()}\n")
        end = time.monotonic() + float(os.environ["HVDLIKE_TEST_BUSY_SECONDS"])
        while time.monotonic() < end:  # Python, outside hvdlike: its engine runs on
            sum(range(1000))
        return
    if first:
        with open(os.path.join(folder, "fault.txt"), "w") as f:
            f.write(f"{time.time()}\n")
    if kind == "link" and first:
        subprocess.run(["ip", "link", "set", link, "down"], check=True)
    elif kind == "frozen":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif kind == "killed":
        os.kill(os.getpid(), signal.SIGKILL)


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[1])


class FaultAt:
    """Calls ``fault`` before step FAULT_STEP (a Keras callback under ``fit``)."""

    def __init__(self, *args: object) -> None:
        self.args = args
        self.step = 0

    def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
        if self.step == FAULT_STEP:
            fault(*self.args)  # type: ignore[arg-type]
        self.step += 1


def train_numpy(at: FaultAt) -> float:
    g = np.ones(1 << 18, np.float32)
    total = 0.0
    for step in range(STEPS):
        at.on_train_batch_begin(step)
        total += float(hvd.allreduce(g, op=hvd.Sum, name="gradient")[0])
    return total


def train_fit(at: FaultAt) -> float:
    import keras
    import hvdlike.keras as hvdk

    class Callback(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            at.on_train_batch_begin(batch, logs)

    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(STEPS * 8, 32)).astype(np.float32)
    y = rng.integers(0, 4, size=STEPS * 8)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(4)])
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.01)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0), Callback()])
    return float(sum(np.sum(w) for w in model.get_weights()))


def main() -> None:
    kind, folder = sys.argv[1], sys.argv[2]
    link = sys.argv[3] if len(sys.argv) > 3 else ""
    hvd.init()
    hosts = hvd.allgather_object(socket.gethostname())
    faulty = ([r for r in range(hvd.size()) if hosts[r] == hosts[-1]] if len(set(hosts)) > 1
              else [hvd.size() - 1])  # one host: its last rank
    print(f"READY rank={hvd.rank()} host={hosts[hvd.rank()]}", flush=True)
    at = FaultAt(kind, folder, link, faulty)
    total = train_fit(at) if os.environ.get("HVDLIKE_TEST_FIT") == "1" else train_numpy(at)
    print(f"DONE rank={hvd.rank()} {total}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
