"""Programs that call ``hvdlike.run`` (tests/test_run_func.py): run as their own process, so
the test can bound them with a timeout, and as a main script, whose functions travel to the
ranks by value.

``python run_func_cases.py CASE NP [HOSTS MPI_ARGS [NETWORK_INTERFACE]]``; prints one JSON line after ``CASE``.
"""
import json
import os
import signal
import socket
import sys

import numpy as np

import hvdlike


def reduce_rank_arrays(scale: float, offset: float = 0.0) -> dict:
    import hvdlike as hvd
    hvd.init()
    x = np.arange(5.0) * (hvd.rank() + 1) * scale
    summed = hvd.allreduce(x, op=hvd.Sum) + offset
    return {"rank": hvd.rank(), "size": hvd.size(), "sum": summed.tolist(),
            "host": socket.gethostname(),  # and the address this rank reached the caller at:
            "caller": os.environ["HVDLIKE_RUN_ADDRESS"].rsplit(":", 1)[0]}


def caller_answers_at() -> dict:
    """Whether the caller's port takes a connection at the address the ranks were told and at
    127.0.0.2 (only a socket bound to every interface answers there)."""
    told, port = os.environ["HVDLIKE_RUN_ADDRESS"].rsplit(":", 1)
    answers = {}
    for name, address in (("told", told), ("127.0.0.2", "127.0.0.2")):
        try:
            socket.create_connection((address, int(port)), timeout=10).close()
            answers[name] = True
        except OSError:
            answers[name] = False
    return answers


def fails_on_rank_1() -> str:
    import hvdlike as hvd
    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("rank 1 found bad data")
    hvd.allreduce(np.ones(3))  # the other ranks wait here for rank 1
    return "unreachable"


STRANGER = """
import socket, sys, time
port = int(sys.argv[1])
idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
partial = socket.create_connection(("127.0.0.1", port))
partial.sendall(b"\\x00\\x00\\x00")  # the start of a message's length, never the rest
print("connected", flush=True)
time.sleep(300)
"""


def reduces_after_a_stranger_connects(pid_file: str) -> dict:
    """Rank 0 first starts another process (left running) that holds idle and half-sent
    connections to the caller's port; then every rank reduces as usual."""
    import subprocess
    import hvdlike as hvd
    hvd.init()
    if hvd.rank() == 0:
        port = os.environ["HVDLIKE_RUN_ADDRESS"].rsplit(":", 1)[1]
        stranger = subprocess.Popen(  # none of the rank's output: the job would wait for it
            [sys.executable, "-c", STRANGER, port], start_new_session=True, text=True,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        with open(pid_file, "w") as f:
            f.write(str(stranger.pid))
        assert stranger.stdout.readline() == "connected\n"
    return reduce_rank_arrays(2.0, offset=1.0)


def sleeps() -> None:
    import os
    import time
    print(f"SLEEPING {os.getpid()}", flush=True)
    time.sleep(600)


def main() -> None:
    case, np_ = sys.argv[1], int(sys.argv[2])
    where = {} if len(sys.argv) < 5 else {"hosts": sys.argv[3], "mpi_args": sys.argv[4]}
    if len(sys.argv) > 5:
        where["network_interface"] = sys.argv[5]
    if case == "returns":
        results = hvdlike.run(reduce_rank_arrays, args=(2.0,), kwargs={"offset": 1.0},
                              num_proc=np_, **where)
        print("returns " + json.dumps(results), flush=True)
    elif case == "horovod_arguments":  # horovod.run's arguments without an hvdlike equivalent
        results = hvdlike.run(reduce_rank_arrays, args=(2.0,), kwargs={"offset": 1.0},
                              num_proc=np_, start_timeout=30, use_gloo=True, disable_cache=True)
        print("horovod_arguments " + json.dumps(results), flush=True)
    elif case == "stranger":  # argv[3]: where the stranger's process id is written
        results = hvdlike.run(reduces_after_a_stranger_connects, args=(sys.argv[3],),
                              num_proc=np_)
        print("stranger " + json.dumps(results), flush=True)
    elif case == "listens":
        print("listens " + json.dumps(hvdlike.run(caller_answers_at, num_proc=np_, **where)),
              flush=True)
    elif case == "interrupted":  # the test interrupts this process while the ranks sleep
        # Ctrl-C as a notebook's kernel gets it, even where this process was started with
        # SIGINT ignored (a background job of a shell without job control, as in CI)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        hvdlike.run(sleeps, num_proc=np_)
    elif case == "raises":
        try:
            hvdlike.run(fails_on_rank_1, num_proc=np_)
        except RuntimeError as e:
            print("raises " + json.dumps({"message": str(e), "cause": repr(e.__cause__)}),
                  flush=True)


if __name__ == "__main__":
    main()
