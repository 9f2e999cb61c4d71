"""tf.data service with Horovod's names (hvdlike.tensorflow.data): a compute job
(``python -m hvdlike.tensorflow.data.compute_worker``) and a training job
(tests/tf/workers/data_service_training.py) run side by side as real MPI jobs; every rank's
elements are checked against ``range(N)``. Also the parts alone: the config file, the compute
service's requests, key and timeouts."""
import json
import os
import stat
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from mpi_harness import REPO, launch

N = 40
TRAINING = str(REPO / "tests" / "tf" / "workers" / "data_service_training.py")


def _jobs(tmp_path, compute_np, training_np, flags):
    config = tmp_path / "compute.json"
    compute = [sys.executable, "-m", "hvdlike.tensorflow.data.compute_worker", str(config),
               *flags]
    with ThreadPoolExecutor(1) as pool:
        computing = pool.submit(launch, compute_np, compute, timeout=240)
        training = launch(training_np, [sys.executable, TRAINING, str(config), str(N)],
                          timeout=240)
        compute_job = computing.result()
    return compute_job, training


@pytest.mark.parametrize("compute_np,training_np,flags", [
    (2, 4, []), (2, 2, ["--dispatchers", "2", "--dispatcher-side", "training"])],
    ids=["one-compute-side-dispatcher-np4", "a-training-side-dispatcher-per-rank-np2"])
def test_training_ranks_read_the_dataset_through_the_compute_jobs_workers(
        tmp_path, compute_np, training_np, flags):
    compute, training = _jobs(tmp_path, compute_np, training_np, flags)
    assert not training.timed_out and training.returncode == 0, training.output[-5000:]
    assert not compute.timed_out and compute.returncode == 0, compute.output[-5000:]
    (line,) = [x for x in training.output.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line[len("RESULT "):])
    assert result["side"] == ("training" if flags else "compute")
    # own: every rank read all of them; shared: with one dispatcher, each element went to
    # exactly one rank; with a dispatcher per rank, each rank's job is its own: all of them
    assert all(sorted(got) == list(range(N)) for got in result["own"]), result
    if flags:
        assert all(sorted(got) == list(range(N)) for got in result["shared"]), result
    else:
        # (first come, first served: a rank late to ask may get none)
        assert sorted(x for got in result["shared"] for x in got) == list(range(N)), result
    done = sorted(x.split(" ", 1)[1] for x in training.output.splitlines()
                  if x.startswith("RANK_DONE "))
    # the launcher's variables give hvd.init()'s rank and size before it is called
    assert done == [f"{r} [{r}, {training_np}] [{r}, {training_np}]"
                    for r in range(training_np)], done


def test_the_config_file_round_trips_and_only_its_owner_reads_it(tmp_path):
    from hvdlike.tensorflow.data.compute_service import TfDataServiceConfig
    config = TfDataServiceConfig(2, 3, "training", {"eth0": [("10.0.0.1", 1234)]},
                                 b"\x00\xffkey", timeout=7)
    path = tmp_path / "c.json"
    config.write(str(path))
    assert TfDataServiceConfig.read(str(path)) == config
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.listdir(tmp_path) == ["c.json"]  # no partial file left
    with pytest.raises(ValueError, match="dispatcher_side must be 'compute' or 'training'"):
        TfDataServiceConfig(1, 1, "gpu", {}, b"k")


def test_read_waits_for_the_file_the_compute_job_writes(tmp_path):
    from hvdlike.tensorflow.data.compute_service import TfDataServiceConfig
    config = TfDataServiceConfig(1, 1, "compute", {"lo": [("127.0.0.1", 1)]}, b"k")
    path = tmp_path / "late.json"
    timer = threading.Timer(0.3, config.write, args=(str(path),))
    timer.start()
    assert TfDataServiceConfig.read(str(path), wait_for_file_creation=True) == config
    timer.join()


def test_the_compute_service_answers_its_requests_and_refuses_a_wrong_key():
    from hvdlike.base.compute_service import ComputeClient, ComputeService
    service = ComputeService(dispatchers=2, workers_per_dispatcher=2, key=b"right")
    try:
        addresses = service.addresses()
        assert ("127.0.0.1", service.port) in addresses["lo"]
        client = ComputeClient(addresses, b"right")
        client.register_dispatcher(1, "grpc://h:1")
        assert client.wait_for_dispatcher_registration(1, 5) == "grpc://h:1"
        with pytest.raises(ValueError, match="dispatcher 1 is registered already, at "
                                             "grpc://h:1, not grpc://h:2"):
            client.register_dispatcher(1, "grpc://h:2")
        with pytest.raises(IndexError, match="dispatcher 2 does not exist: this compute "
                                             "service has 2"):
            client.register_dispatcher(2, "grpc://h:3")
        with pytest.raises(TimeoutError, match="no dispatcher 0 registered within 0.2 s"):
            client.wait_for_dispatcher_registration(0, 0.2)
        client.register_worker_for_dispatcher(1, 0)
        with pytest.raises(TimeoutError, match="not all 2 workers of dispatcher 1"):
            client.wait_for_dispatcher_worker_registration(1, 0.2)
        client.register_worker_for_dispatcher(1, 1)
        client.wait_for_dispatcher_worker_registration(1, 5)
        with pytest.raises(ConnectionError, match="refused this client's key"):
            ComputeClient(addresses, b"wrong").register_dispatcher(0, "grpc://x:1")
        waiting = threading.Thread(target=client.wait_for_shutdown)
        waiting.start()
        raised = []

        def wait_for_dispatcher_0():
            try:
                client.wait_for_dispatcher_registration(0, 60)
            except ConnectionError as exc:
                raised.append(str(exc))
        never = threading.Thread(target=wait_for_dispatcher_0)
        never.start()
        time.sleep(0.5)  # both requests are waiting in the service
        client.shutdown()
        waiting.join(10)
        never.join(10)
        assert not waiting.is_alive() and not never.is_alive()
        assert raised == ["hvdlike compute service: shut down while no dispatcher 0 "
                          "registered yet"]
    finally:
        service.shutdown()
    with pytest.raises(ConnectionError, match="cannot reach the compute service"):
        ComputeClient(addresses, b"right").shutdown()


def test_send_to_data_service_with_training_side_dispatchers_says_what_to_use():
    import tensorflow as tf

    from hvdlike.tensorflow.data.compute_service import TfDataServiceConfig
    config = TfDataServiceConfig(1, 1, "training", {}, b"k")
    with pytest.raises(ValueError, match="with tf_data_service"):
        tf.data.Dataset.range(3).send_to_data_service(config, 0, 1)


def test_env_rank_and_size_come_from_the_launchers_variables(monkeypatch):
    from hvdlike.runner.common.util import env
    for name in ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
                 "SLURM_PROCID", "SLURM_NTASKS", "HOROVOD_RANK", "HOROVOD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert env.get_env_rank_and_size() == (0, 1)
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    assert env.get_env_rank_and_size() == (3, 8)
    monkeypatch.setenv("PMI_RANK", "1")
    with pytest.raises(RuntimeError, match="PMI_RANK is set, PMI_SIZE is not"):
        env.get_env_rank_and_size()
