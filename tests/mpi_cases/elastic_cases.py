"""Scripts for the elastic and restart tests, run by hvdlikerun (not through the worker).

``python elastic_cases.py MODE VICTIM KILL_STEP STEPS``: every rank trains a vector ``w``
with averaged gradients that depend only on (rank, size, step), commits after every step,
and prints ``RESULT`` with its final state (and writes it to
``$HVDLIKE_TEST_RESULT_DIR/rank<r>.json`` where that is set). ``VICTIM`` kills itself with
SIGKILL at ``KILL_STEP`` (in the first world, and in the first run when restarted; never in a
world that replaced dead ranks under ``hvdlikerun --max-np``):

- ``before``: before submitting that step's all-reduce;
- ``during``: right after submitting it (the others may be inside the transfer);
- ``plain``: ``before``, and the script does not use ``hvdlike.elastic.run``;
- ``caught``: ``plain``, and the script catches the error by Horovod's name for it
  (``hvdlike.common.exceptions.HorovodInternalError``) and prints ``CAUGHT``;
- ``always``: ``before``, in every run of a restarted job;
- ``reset_bug``: ``before``, and the survivors' reset callback raises (a bug every
  survivor hits);
- ``late``: ``before``, and the lowest surviving rank starts its recovery
  ``HVDLIKE_TEST_LATE_SECONDS`` late (its state's ``restore`` sleeps first): the others wait
  for it in MPI_Comm_shrink;
- ``oom``: before that step's all-reduce the victim joins the memory cgroup named by
  ``HVDLIKE_TEST_OOM_CGROUP`` (cgroup v1, made by the test with a small limit) and allocates
  until the kernel's OOM killer kills it;
- ``frozen_host``: before that step's all-reduce every rank on the victim's host stops
  itself (SIGSTOP);
- ``link_host``: before that step's all-reduce the victim sets its host's link
  ``HVDLIKE_TEST_LINK`` down (``ip link``), and its host's ranks train on, cut off.

With ``HVDLIKE_TEST_SLOW_START`` (seconds) a rank started in place of a dead one sleeps that
long before ``hvd.init()`` (MPI_Init), as one whose program imports a large framework first.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np

import hvdlike as hvd

DIM = 64  # a RESULT line stays under PIPE_BUF, so lines of different ranks never mix


def gradient(rank: int, size: int, step: int) -> np.ndarray:
    rng = np.random.default_rng(1000 * step + 10 * rank + size)
    return rng.standard_normal(DIM).astype(np.float64)


def die() -> None:
    print(f"KILLING rank={hvd.rank()} at {time.time()}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def run_out_of_memory() -> None:
    with open(os.path.join(os.environ["HVDLIKE_TEST_OOM_CGROUP"], "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    print(f"KILLING rank={hvd.rank()} at {time.time()}", flush=True)
    hog = []
    while True:  # touch every page, 64 MiB at a time, until the OOM killer ends us
        hog.append(np.ones(8 << 20))


def main() -> None:
    mode, victim, kill_step, steps = sys.argv[1], *map(int, sys.argv[2:5])
    if "OMPI_PARENT_PORT" in os.environ:  # started by MPI_Comm_spawn
        time.sleep(float(os.environ.get("HVDLIKE_TEST_SLOW_START", "0")))
    hvd.init()
    replacement = hvd.elastic.is_replacement()  # started in place of a dead rank
    first_size = hvd.size()
    first_run = os.environ.get("HVDLIKE_RESTART", "0") == "0"
    faulty = [victim]
    if mode in ("frozen_host", "link_host") and not replacement:  # the victim's host's ranks
        hosts = hvd.allgather_object(socket.gethostname())
        faulty = [r for r in range(first_size) if hosts[r] == hosts[victim]]
    state = hvd.elastic.ObjectState(step=0, w=np.zeros(DIM), sizes=[])
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])
    if mode == "reset_bug":
        def bug() -> None:
            raise ValueError(f"a bug in a reset callback on rank {hvd.rank()}")
        state.register_reset_callbacks([bug])

    if mode == "late" and hvd.rank() == (1 if victim == 0 else 0):
        restore = state.restore

        def late_restore() -> None:
            time.sleep(float(os.environ["HVDLIKE_TEST_LATE_SECONDS"]))
            restore()
        state.restore = late_restore  # type: ignore[method-assign]

    def train(state: hvd.elastic.ObjectState) -> None:
        while state.step < steps:
            dying = (hvd.size() == first_size and (first_run or mode == "always")
                     and hvd.rank() in faulty and state.step == kill_step
                     and not resets and not replacement)
            if dying and mode == "oom":
                run_out_of_memory()
            if dying and mode in ("before", "plain", "caught", "always", "reset_bug", "late"):
                die()
            if dying and mode == "frozen_host":
                print(f"FREEZING rank={hvd.rank()} at {time.time()}", flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
            if dying and mode == "link_host" and hvd.rank() == victim:
                print(f"CUTTING rank={hvd.rank()} at {time.time()}", flush=True)
                subprocess.run(["ip", "link", "set", os.environ["HVDLIKE_TEST_LINK"], "down"],
                               check=True)
            g = gradient(hvd.rank(), hvd.size(), state.step)
            handle = hvd.allreduce_async(g, name="grad")
            if dying and mode == "during":
                die()
            state.w = state.w - 0.1 * hvd.synchronize(handle)
            state.sizes.append(hvd.size())
            state.step += 1
            state.commit()
            # one write (the tests run Python unbuffered, and MPICH forwards each rank's
            # writes as they come: a line's text and its newline could be split by another's)
            print(f"COMMITTED rank={hvd.rank()} step={state.step - 1}\n", end="", flush=True)

    if mode == "plain":
        state.sync()
        train(state)
    elif mode == "caught":
        from hvdlike.common.exceptions import HorovodInternalError
        try:
            state.sync()
            train(state)
        except HorovodInternalError as e:
            print(f"CAUGHT rank={hvd.rank()} failed={e.failed} step={state.step}", flush=True)
            return
    else:
        hvd.elastic.run(train)(state)
    result = json.dumps({"rank": hvd.rank(), "size": hvd.size(), "w": state.w.tolist(),
                         "sizes": state.sizes, "resets": resets, "host": socket.gethostname()})
    print("RESULT " + result + "\n", end="", flush=True)
    folder = os.environ.get("HVDLIKE_TEST_RESULT_DIR")
    if folder:  # also a file: Open MPI can lose a second host's last output (test_cluster)
        path = os.path.join(folder, f"rank{hvd.rank()}-{socket.gethostname()}.json")
        with open(path + ".tmp", "w") as f:
            f.write(result)
        os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
