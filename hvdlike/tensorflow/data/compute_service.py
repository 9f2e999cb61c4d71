"""tf.data service for training jobs, with Horovod's names (docs/tensorflow.md).

A compute job (``hvdlikerun -np N python -m hvdlike.tensorflow.data.compute_worker FILE``)
runs tf.data service workers, and the dispatchers when they are on its side; it writes a
``TfDataServiceConfig`` to FILE. A training job reads it and hands its input pipeline to the
service: ``dataset.send_to_data_service(config, rank, size)`` (dispatchers on the compute
side) or ``with tf_data_service(config, rank) as address: ...distribute(service=address)``
(on the training side). Its rank 0 ends the compute job with
``config.compute_client().shutdown()``.
"""
import binascii
import dataclasses
import json
import os
import socket
import time
from contextlib import contextmanager
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Tuple

import tensorflow as tf

from hvdlike.base import log
from hvdlike.base.compute_service import ComputeClient

__all__ = ["TfDataServiceConfig", "compute_worker_fn", "send_to_data_service", "tf_data_service"]

_SIDES = ("compute", "training")
_SAY_WAITING_AFTER_S = 60.0


@dataclasses.dataclass(frozen=True)
class TfDataServiceConfig:
    """Where the compute service is and how the tf.data service is laid out: ``dispatchers``
    (1, or one per training rank), ``workers_per_dispatcher``, ``dispatcher_side``
    ("compute" or "training"), the service's ``addresses`` and ``key``, and ``timeout`` (s)
    for dispatchers and workers to register."""
    dispatchers: int
    workers_per_dispatcher: int
    dispatcher_side: str
    addresses: Mapping[str, Sequence[Tuple[str, int]]]
    key: bytes
    timeout: int = 60

    def __post_init__(self) -> None:
        if self.dispatcher_side not in _SIDES:
            raise ValueError(f"dispatcher_side must be 'compute' or 'training', got "
                             f"{self.dispatcher_side!r}")

    def compute_client(self, verbose: int = 1) -> ComputeClient:
        """A client of the compute job's service (``shutdown()`` ends that job)."""
        return ComputeClient(self.addresses, self.key, verbose=verbose)

    def to_dict(self) -> Dict[str, Any]:
        return {**dataclasses.asdict(self), "key": binascii.hexlify(self.key).decode()}

    @staticmethod
    def from_dict(config: Mapping[str, Any]) -> "TfDataServiceConfig":
        return TfDataServiceConfig(
            dispatchers=int(config["dispatchers"]),
            workers_per_dispatcher=int(config["workers_per_dispatcher"]),
            dispatcher_side=config["dispatcher_side"],
            addresses={name: [(str(a[0]), int(a[1])) for a in found]
                       for name, found in config["addresses"].items()},
            key=binascii.unhexlify(config["key"]), timeout=int(config.get("timeout", 60)))

    def write(self, filename: str) -> None:
        """Write the config to ``filename`` at once (a reader never sees half of it),
        readable by its owner only: it holds the service's key."""
        partial = f"{filename}.{os.getpid()}.partial"
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(self.to_dict(), f)
        os.replace(partial, filename)

    @staticmethod
    def read(filename: str, wait_for_file_creation: bool = False) -> "TfDataServiceConfig":
        """The config in ``filename``; with ``wait_for_file_creation``, once the compute job
        has written it (saying so after a minute of waiting)."""
        started, said = time.monotonic(), False
        while wait_for_file_creation and not os.path.exists(filename):
            if not said and time.monotonic() - started > _SAY_WAITING_AFTER_S:
                log.logger.warning(
                    f"waiting for {filename}, which the compute job writes: start it with "
                    f"`hvdlikerun -np N python -m hvdlike.tensorflow.data.compute_worker "
                    f"{filename}`")
                said = True
            time.sleep(0.5)
        with open(filename) as f:
            return TfDataServiceConfig.from_dict(json.load(f))


def _this_host() -> str:
    """This machine's name, as other hosts reach it (``localhost`` where the name does not
    resolve even here)."""
    name = socket.gethostname()
    try:
        socket.getaddrinfo(name, None)
    except OSError:
        return "localhost"
    return name


def start_dispatcher() -> Tuple[Any, str]:
    """A tf.data dispatcher on this machine, and its address as other hosts reach it."""
    server = tf.data.experimental.service.DispatchServer()
    port = server.target.rsplit(":", 1)[1]
    return server, f"grpc://{_this_host()}:{port}"


def stop(server: Any) -> None:
    """Stop a tf.data dispatcher or worker server (TensorFlow's ``stop``, else ``_stop``)."""
    (getattr(server, "stop", None) or server._stop)()


@contextmanager
def tf_data_service(compute_config: TfDataServiceConfig, rank: int) -> Iterator[str]:
    """The address of this training rank's dispatcher, once it and its workers have
    registered. With dispatchers on the training side, the dispatcher is started here
    (on rank 0 alone when there is one) and stopped on leaving."""
    compute = compute_config.compute_client()
    several = compute_config.dispatchers > 1
    server = None
    if compute_config.dispatcher_side == "training" and (several or rank == 0):
        server, address = start_dispatcher()
        compute.register_dispatcher(rank if several else 0, address)
    index = rank if several else 0
    address = compute.wait_for_dispatcher_registration(index, compute_config.timeout)
    compute.wait_for_dispatcher_worker_registration(index, compute_config.timeout)
    try:
        yield address
    finally:
        if server is not None:
            stop(server)


def send_to_data_service(dataset: tf.data.Dataset, compute_config: TfDataServiceConfig,
                         rank: int, size: Optional[int] = None,
                         processing_mode: str = "distributed_epoch",
                         reuse_dataset: bool = False,
                         round_robin: bool = False) -> tf.data.Dataset:
    """``dataset`` processed by the compute job's tf.data service workers (dispatchers on
    the compute side). ``reuse_dataset``: the training ranks share one service job (each
    element goes to one of them) instead of each reading the whole dataset; with
    ``round_robin`` too, they take its elements in turn (``size`` needed; the dataset must be
    infinite, e.g. ``repeat()``). Also reached as ``tf.data.Dataset.send_to_data_service``."""
    if compute_config.dispatcher_side == "training":
        raise ValueError("send_to_data_service needs dispatchers on the compute side; with "
                         "them on the training side, start this rank's with "
                         "`with tf_data_service(config, rank) as address:` and apply "
                         "tf.data.experimental.service.distribute(service=address, ...)")
    if round_robin and reuse_dataset and size is None:
        raise ValueError("send_to_data_service: round_robin takes its turns among `size` "
                         "training ranks: pass size (hvd.size())")
    with tf_data_service(compute_config, rank) as address:
        return dataset.apply(tf.data.experimental.service.distribute(
            processing_mode=processing_mode, service=address,
            job_name="job" if reuse_dataset else None,
            consumer_index=rank if reuse_dataset and round_robin else None,
            num_consumers=size if reuse_dataset and round_robin else None))


tf.data.Dataset.send_to_data_service = send_to_data_service


def compute_worker_fn(compute_config: TfDataServiceConfig) -> None:
    """Run this compute rank's tf.data service worker (and dispatcher, when it is the first
    rank of its dispatcher's group on the compute side) until the training job asks for the
    shutdown."""
    import hvdlike as hvd
    hvd.init()
    rank = hvd.rank()
    per = compute_config.workers_per_dispatcher
    index = rank // per
    compute = compute_config.compute_client()
    dispatcher = None
    if compute_config.dispatcher_side == "compute" and rank % per == 0:
        dispatcher, address = start_dispatcher()
        compute.register_dispatcher(index, address)
    address = compute.wait_for_dispatcher_registration(index, compute_config.timeout)
    worker = tf.data.experimental.service.WorkerServer(tf.data.experimental.service.WorkerConfig(
        dispatcher_address=address.split("://", 1)[-1],
        worker_address=f"{_this_host()}:%port%",  # as the training hosts reach it
        heartbeat_interval_ms=1000, dispatcher_timeout_ms=compute_config.timeout * 1000))
    worker.start()
    compute.register_worker_for_dispatcher(index, rank)
    compute.wait_for_shutdown()
    stop(worker)
    if dispatcher is not None:
        stop(dispatcher)
