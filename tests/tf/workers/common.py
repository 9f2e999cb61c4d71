"""Shared setup for TF test workers: threads, init, and the CHECK reporter."""
import contextlib
import os
import shutil
import sys
import tempfile
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The workers draw nothing. With matplotlib installed (the benchmarks plot with it), importing
# TensorFlow imports Keras, which imports matplotlib.pyplot if it can: about 1 s of each
# rank's start-up on a 2-core machine. Keras goes on without it (an ImportError it catches).
sys.modules.setdefault("matplotlib", None)
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


# every print() of a worker: its text and newline leave in one write (see say)
sys.stdout.reconfigure(write_through=False, line_buffering=True)


def say(text):
    """Print ``text`` and its newline in one write: the tests run Python unbuffered, and the
    MPI launchers forward each rank's writes as they come, so a line's text and its newline,
    written apart, could be split by another rank's line."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def check(name):
    """Decorator: run the check now, print ``CHECK name rank=r OK`` (and ``TIMING name rank=r
    seconds``) or the failure."""
    def deco(fn):
        if ONLY and name not in ONLY:
            return fn
        started = time.perf_counter()
        try:
            fn()
            say(f"CHECK {name} rank={hvd.rank()} OK")
            # what a check costs, to find the slow ones: grep '^TIMING' in a job's output
            say(f"TIMING {name} rank={hvd.rank()} {time.perf_counter() - started:.2f} s")
        except Exception:  # report and continue with the next check
            FAILED.append(name)
            say(f"CHECK {name} rank={hvd.rank()} FAIL\n{traceback.format_exc()}")
        return fn
    return deco


@contextlib.contextmanager
def shared_temp_dir(process_set=None):
    """A directory rank 0 makes, the same path on every rank; removed (by rank 0, after every
    rank is done with it) when the block ends."""
    ps = process_set or hvd.global_process_set
    path = hvd.broadcast_object(tempfile.mkdtemp(prefix="hvdlike-test-") if hvd.rank() == 0
                                else None, 0, process_set=ps)
    try:
        yield path
    finally:
        hvd.barrier(process_set=ps)
        if hvd.rank() == 0:
            shutil.rmtree(path, ignore_errors=True)


def close(np_mod=np):
    if FAILED:
        print(f"rank {hvd.rank()} failed: {FAILED}", flush=True)
        sys.stdout.flush()
        os._exit(1)


def assert_close(a, b, rtol=1e-6, atol=0.0, msg=""):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol, err_msg=msg)


def listening_addresses(port):
    """The local addresses of the TCP sockets listening on ``port`` in this network namespace
    (``/proc/net/tcp`` and ``tcp6``), as ``ipaddress`` objects; an IPv4-mapped IPv6 address
    is given as its IPv4 address."""
    import ipaddress
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            address, port_hex = fields[1].split(":")
            if fields[3] != "0A" or int(port_hex, 16) != port:  # 0A: LISTEN
                continue
            # the kernel prints each 32-bit word of the address in host (little-endian) order
            raw = b"".join(bytes.fromhex(address[i:i + 8])[::-1] for i in range(0, width, 8))
            ip = ipaddress.ip_address(raw)
            found.append(ip.ipv4_mapped or ip if ip.version == 6 else ip)
    return found


def assert_listens_only_on(address, port):
    """Every socket listening on ``port`` here is bound to ``address`` (a host name or IP, as
    TF_CONFIG publishes it), and there is at least one."""
    import ipaddress
    import socket
    ip = ipaddress.ip_address(socket.getaddrinfo(address.strip("[]"), port,
                                                 type=socket.SOCK_STREAM)[0][4][0])
    found = listening_addresses(port)
    assert found and all(a == ip for a in found), (
        f"sockets listening on port {port}: {[str(a) for a in found]}, expected only {ip}")
