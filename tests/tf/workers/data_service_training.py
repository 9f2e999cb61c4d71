"""The training side of the tf.data service test (tests/tf/test_tf_data_service.py).

``python data_service_training.py CONFIG_FILE N``: reads the compute job's config, then hands
``range(N)`` to the service twice: shared by the ranks (``reuse_dataset``: each element to
one rank) and not shared (each rank reads it all); with dispatchers on the training side
through ``tf_data_service`` and ``distribute`` (Horovod's two ways). Rank 0 prints ``RESULT``
with what every rank received, and ends the compute job.
"""
import json
import sys

import tensorflow as tf

import hvdlike.tensorflow as hvd
from hvdlike.runner.common.util import env
from hvdlike.tensorflow.data.compute_service import TfDataServiceConfig, tf_data_service


def read(config: TfDataServiceConfig, n: int) -> tuple:
    """The elements this rank received with the dataset shared, and not."""
    def through(dataset: tf.data.Dataset, shared: bool, address: str = "") -> list:
        if config.dispatcher_side == "compute":
            dataset = dataset.send_to_data_service(config, hvd.rank(), hvd.size(),
                                                   reuse_dataset=shared)
        else:
            dataset = dataset.apply(tf.data.experimental.service.distribute(
                processing_mode="distributed_epoch", service=address,
                job_name="shared" if shared else None))
        return [int(x) for x in dataset]

    if config.dispatcher_side == "compute":
        return through(tf.data.Dataset.range(n), True), through(tf.data.Dataset.range(n), False)
    with tf_data_service(config, hvd.rank()) as address:
        got = (through(tf.data.Dataset.range(n), True, address),
               through(tf.data.Dataset.range(n), False, address))
        hvd.allgather_object(None)  # the dispatchers stay until every rank has read
        return got


def main() -> None:
    configfile, n = sys.argv[1], int(sys.argv[2])
    config = TfDataServiceConfig.read(configfile, wait_for_file_creation=True)
    before = env.get_env_rank_and_size()
    hvd.init()
    shared, own = read(config, n)
    out = {"env_rank_size": before, "rank_size": (hvd.rank(), hvd.size()),
           "side": config.dispatcher_side, "shared": hvd.allgather_object(shared),
           "own": hvd.allgather_object(own)}
    if hvd.rank() == 0:
        print("RESULT " + json.dumps(out), flush=True)
        config.compute_client().shutdown()
    hvd.allgather_object(None)
    print(f"RANK_DONE {hvd.rank()} {json.dumps(out['rank_size'])} "
          f"{json.dumps(out['env_rank_size'])}", flush=True)


if __name__ == "__main__":
    main()
