"""The compute job of a tf.data service (Horovod's ``horovod.tensorflow.data.compute_worker``):

    hvdlikerun -np N python -m hvdlike.tensorflow.data.compute_worker CONFIG_FILE \\
        [--dispatchers D] [--dispatcher-side compute|training] [--timeout S]

Rank 0 starts the compute service and writes its ``TfDataServiceConfig`` to CONFIG_FILE;
every rank runs a tf.data service worker (N / D per dispatcher) until the training job's
rank 0 calls ``config.compute_client().shutdown()``.
"""
import argparse
import secrets
from typing import List, Optional

import hvdlike as hvd
from hvdlike.base.compute_service import ComputeService
from hvdlike.tensorflow.data.compute_service import TfDataServiceConfig, compute_worker_fn


def main(dispatchers: int, dispatcher_side: str, configfile: str, timeout: int) -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if dispatchers < 1 or size % dispatchers:
        raise ValueError(f"--dispatchers {dispatchers}: the compute job's {size} ranks must "
                         "divide evenly among the dispatchers (each has size / dispatchers "
                         "workers)")
    service, config = None, None
    try:
        if rank == 0:
            key = secrets.token_bytes(32)
            service = ComputeService(dispatchers, size // dispatchers, key=key)
            config = TfDataServiceConfig(dispatchers, size // dispatchers, dispatcher_side,
                                         service.addresses(), key, timeout)
            config.write(configfile)
        config = hvd.broadcast_object(config, root_rank=0, name="TfDataServiceConfig")
        compute_worker_fn(config)
    finally:
        if service is not None:
            service.shutdown()


def _parse(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m hvdlike.tensorflow.data.compute_worker",
                                description="The compute job of a tf.data service.")
    p.add_argument("configfile", help="where to write the config the training job reads")
    p.add_argument("--dispatchers", type=int, default=1,
                   help="1, or one per training rank (default 1)")
    p.add_argument("--dispatcher-side", choices=("compute", "training"), default="compute",
                   help="where the dispatchers run (default: compute)")
    p.add_argument("--timeout", type=int, default=60,
                   help="seconds for dispatchers and workers to register (default 60)")
    return p.parse_args(argv)


if __name__ == "__main__":
    args = _parse()
    main(args.dispatchers, args.dispatcher_side, args.configfile, args.timeout)
