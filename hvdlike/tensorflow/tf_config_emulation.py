"""TF_CONFIG from the MPI world, so native ``tf.distribute`` starts under ``mpirun``.

``tf.distribute.MultiWorkerMirroredStrategy`` (and the other cluster strategies) read the
cluster from the ``TF_CONFIG`` environment variable, which normally has to be written by
hand on every node.  Under ``mpirun -np N python train.py``::

    import hvdlike.tensorflow as hvd
    hvd.export_tf_config()                           # before any TensorFlow op runs
    strategy = tf.distribute.MultiWorkerMirroredStrategy()

Every rank picks a free TCP port on its own host (bound on the address it publishes, held
open until all ranks have reported, so two ranks on one host never get the same port),
the ``host:port`` pairs are exchanged with one MPI allgather, and every rank builds the
same cluster dict with its own ``task``.  This module runs no TensorFlow code (it only
uses the MPI core), so it is safe to call before TensorFlow initialises; it must be called
by every rank (it is a collective).

TensorFlow's gRPC servers bind the wildcard address of their port (every interface) and
take no bind address; ``export_tf_config`` has the rank's server listen on the address it
publishes only, through the bind shim that ``hvdlikerun`` preloads
(``hvdlike.base.bind_shim``), and warns where a rank runs without it.
"""
import ipaddress
import json
import os
import socket
from typing import Any, Dict, Optional, Sequence

import hvdlike as _core
from hvdlike import ProcessSet, global_process_set
from hvdlike.base import bind_shim, log

ROLES = ("chief", "worker", "evaluator", "ps")


def _host_address(host):
    """The address other ranks use to reach this one: ``host`` if given, else
    ``HVDLIKE_TF_CONFIG_HOST``, else this machine's host name (socket.gethostname())."""
    return host or os.environ.get("HVDLIKE_TF_CONFIG_HOST") or socket.gethostname()


def _probe_port(address, port):
    """Bind a listening socket on ``address`` (port 0: the OS picks a free one); return it
    open, so that no other rank on this host can be handed the same port meanwhile."""
    try:
        infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise RuntimeError(f"hvdlike.tensorflow.tf_config: rank {_core.rank()} cannot resolve "
                           f"its host address {address!r} ({e}); pass host= or set "
                           "HVDLIKE_TF_CONFIG_HOST to a name or IP the other hosts can reach."
                           ) from e
    family, stype, proto, _, sockaddr = infos[0]
    sock = socket.socket(family, stype, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(sockaddr)
    sock.listen(1)
    return sock, sock.getsockname()[1]


def _roles_for(size, chief, evaluator, roles):
    if roles is not None:
        roles = list(roles)
        if len(roles) != size:
            raise ValueError(f"hvdlike.tensorflow.tf_config: roles has {len(roles)} entries "
                             f"but the job has {size} ranks (one role per rank).")
        bad = [r for r in roles if r not in ROLES]
        if bad:
            raise ValueError(f"hvdlike.tensorflow.tf_config: unknown roles {bad} "
                             f"(allowed: {', '.join(ROLES)}).")
        if roles.count("chief") > 1 or roles.count("evaluator") > 1:
            raise ValueError("hvdlike.tensorflow.tf_config: at most one chief and one "
                             "evaluator.")
        return roles
    out = ["worker"] * size
    if chief:
        out[0] = "chief"
    if evaluator:
        if size < 2 + (1 if chief else 0):
            raise ValueError("hvdlike.tensorflow.tf_config: evaluator=True needs at least one "
                             "other training rank.")
        out[-1] = "evaluator"
    return out


def tf_config(chief: bool = False, evaluator: bool = False,
              roles: Optional[Sequence[str]] = None, host: Optional[str] = None,
              port: int = 0,
              process_set: ProcessSet = global_process_set) -> Dict[str, Any]:
    """Build this rank's ``TF_CONFIG`` dict from the MPI world (a collective).

    Every rank must call it with the same ``chief``/``evaluator``/``roles``.  Default: every
    rank is a ``worker`` (task ``rank``; worker 0 acts as chief, as in
    MultiWorkerMirroredStrategy).  ``chief=True`` makes rank 0 the ``chief`` task;
    ``evaluator=True`` makes the last rank the ``evaluator`` (listed in the cluster as TF
    expects; MultiWorkerMirroredStrategy does not train on it).  ``roles``: an explicit role
    per rank (``"chief"``, ``"worker"``, ``"evaluator"``, ``"ps"``).  ``host``: the address
    to publish for this rank (default: ``HVDLIKE_TF_CONFIG_HOST`` or the host name);
    ``port``: 0 picks a free port, or pass a fixed one.

    Returns ``{"cluster": {role: ["host:port", ...]}, "task": {"type": role, "index": i}}``:
    the same ``cluster`` on every rank, tasks numbered in rank order within each role.
    """
    if not _core.is_initialized():
        _core.init()
    rank, size = process_set.rank(), process_set.size()
    task_roles = _roles_for(size, chief, evaluator, roles)
    address = _host_address(host)
    sock, chosen = _probe_port(address, int(port))
    try:
        addresses = _core.allgather_object(f"{_format_host(address)}:{chosen}",
                                           process_set=process_set)
    finally:
        sock.close()
    cluster, index_of = {}, []
    for role, addr in zip(task_roles, addresses):
        cluster.setdefault(role, []).append(addr)
        index_of.append(len(cluster[role]) - 1)
    if len(set(addresses)) != len(addresses):  # cannot happen with port=0
        raise RuntimeError(f"hvdlike.tensorflow.tf_config: duplicate addresses {addresses}; "
                           "with a fixed port= every rank needs its own host.")
    return {"cluster": cluster, "task": {"type": task_roles[rank], "index": index_of[rank]}}


def _format_host(address):
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def export_tf_config(chief: bool = False, evaluator: bool = False,
                     roles: Optional[Sequence[str]] = None, host: Optional[str] = None,
                     port: int = 0, process_set: ProcessSet = global_process_set,
                     overwrite: bool = False, num_ps: int = 0) -> Dict[str, Any]:
    """Compute ``tf_config`` and store it as JSON in ``os.environ["TF_CONFIG"]``.

    Call it on every rank before the first TensorFlow operation runs (at least before the
    strategy is created: MultiWorkerMirroredStrategy configures TensorFlow's collective
    runtime at start-up).  An existing ``TF_CONFIG`` is kept unless ``overwrite=True``
    (every rank must then agree, or the call would not be collective): returns the dict
    in effect. The rank's TensorFlow server will listen only on the address it publishes
    (through the bind shim ``hvdlikerun`` preloads; without it rank 0 warns, and the server
    listens on every interface, as TensorFlow does).

    ``num_ps`` > 0: a ParameterServerStrategy cluster: rank 0 is the ``chief``, ranks
    1..num_ps the ``ps`` tasks, the rest ``worker`` tasks (or place them yourself: ``roles``
    with one ``chief``, ``ps`` and ``worker`` tasks). On ps and worker ranks this call
    then starts their ``tf.distribute.Server`` and does not return: it serves until the
    chief's script ends, then exits the process with status 0. Only the chief goes on to
    build the strategy and the ``ClusterCoordinator``.
    """
    if not _core.is_initialized():
        _core.init()
    if num_ps:
        size = process_set.size()
        if roles is not None or chief or evaluator:
            raise ValueError("hvdlike.tensorflow.export_tf_config: give num_ps or roles/chief/"
                             "evaluator, not both")
        if not 1 <= int(num_ps) <= size - 2:
            raise ValueError(f"hvdlike.tensorflow.export_tf_config: num_ps={num_ps} needs "
                             f"1..{max(0, size - 2)} on {size} ranks (one chief and at least "
                             "one worker besides the ps tasks)")
        roles = ["chief"] + ["ps"] * int(num_ps) + ["worker"] * (size - 1 - int(num_ps))
    elif roles is not None and "ps" in roles and ("chief" not in roles or "worker" not in roles):
        raise ValueError("hvdlike.tensorflow.export_tf_config: roles with ps tasks make a "
                         "ParameterServerStrategy cluster, which needs one chief and at least "
                         f"one worker (got {list(roles)})")
    existing = os.environ.get("TF_CONFIG")
    keep = bool(existing) and not overwrite
    keep_all = _core.allgather_object(keep, process_set=process_set)
    if all(keep_all):
        return json.loads(existing)
    if any(keep_all):
        have = [r for r, k in enumerate(keep_all) if k]
        raise RuntimeError(f"hvdlike.tensorflow.export_tf_config: TF_CONFIG is already set on "
                           f"ranks {have} only; unset it everywhere or pass overwrite=True.")
    config = tf_config(chief=chief, evaluator=evaluator, roles=roles, host=host, port=port,
                       process_set=process_set)
    os.environ["TF_CONFIG"] = json.dumps(config)
    _listen_only_on_published_address(config, process_set)
    if "ps" in config["cluster"]:
        _serve_until_chief_done(config, process_set)
    return config


def _listen_only_on_published_address(config: Dict[str, Any],
                                      process_set: _core.ProcessSet) -> None:
    """Have this rank's TensorFlow server bind only the address it publishes (the bind shim's
    ``HVDLIKE_TF_BIND=PORT=IP``); rank 0 warns, once for the job, about ranks whose server
    will listen on every interface instead (a collective)."""
    task = config["task"]
    published = config["cluster"][task["type"]][task["index"]]
    host, port = published.rsplit(":", 1)
    ip = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)[0][4][0]
    hosts = {a.rsplit(":", 1)[0] for addrs in config["cluster"].values() for a in addrs}
    if ipaddress.ip_address(ip).is_loopback and len(hosts) > 1:
        # this host's name resolves to loopback here only: the other hosts reach it otherwise
        why = f"{host} resolves to {ip} (loopback) here; set HVDLIKE_TF_CONFIG_HOST to its IP"
    elif not bind_shim.loaded():
        why = ("the bind shim is not preloaded (start with hvdlikerun, or "
               "mpirun -x LD_PRELOAD=$(python -m hvdlike.runner.bind_shim))")
    else:
        os.environ[bind_shim.VARIABLE] = f"{port}={ip}"
        why = ""
    whys = _core.allgather_object(why, process_set=process_set)
    if process_set.rank() == 0 and any(whys):
        ranks_by_why: Dict[str, list] = {}
        for r, w in enumerate(whys):
            if w:
                ranks_by_why.setdefault(w, []).append(str(r))
        listed = "; ".join(f"ranks {', '.join(rs)}: {w}" for w, rs in ranks_by_why.items())
        log.logger.warning("export_tf_config: TensorFlow's servers of these ranks listen on "
                           f"every interface of their host, not only the published address: "
                           f"{listed}")


def _serve_until_chief_done(config: Dict[str, Any], process_set: _core.ProcessSet) -> None:
    """ps and worker ranks: run the TensorFlow server until the chief's script ends, then
    leave (collectively, with hvdlike's shutdown) and exit 0. The chief returns at once."""
    import atexit
    import sys
    import time

    from hvdlike import runtime
    done = runtime.state("export_tf_config").world.Dup()  # the chief's "finished" barrier
    task = config["task"]
    if task["type"] == "chief":
        atexit.register(lambda: done.Ibarrier().Wait())
        return
    import tensorflow as tf
    tf.distribute.Server(tf.train.ClusterSpec(config["cluster"]), job_name=task["type"],
                         task_index=task["index"], protocol="grpc", start=True)
    request = done.Ibarrier()
    while not request.Test():  # sleep, not spin: the chief and the servers need the cores
        time.sleep(0.05)
    sys.stdout.flush()
    sys.stderr.flush()
    _core.shutdown()
    from mpi4py import MPI
    MPI.Finalize()  # with the chief's, so that the launcher sees a clean end
    os._exit(0)  # TensorFlow's servers cannot be stopped; their threads would keep us alive
