"""The GPU path on a real GPU: every collective x dtype x op equals its NumPy reference on every
rank, from CuPy arrays and from PyTorch CUDA tensors; NCCL at np=1 (NCCL refuses two ranks on
one GPU), the host-staged path at np=2 on one GPU (chosen automatically, with one warning),
NCCL at np=2 where there are two GPUs; stream ordering, join, fusion-buffer reuse, and the
errors for mixed or mismatched devices. Skipped, saying why, on machines without a GPU:
scripts/gpu_check.sh runs them on a GPU machine."""
import importlib.util
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from collective_cases import cases
from mpi_harness import WORKER, launch, run_mpi
from test_collectives import assert_same, expected

pytestmark = pytest.mark.gpu


def _gpus() -> int:
    if importlib.util.find_spec("cupy") is None:
        return 0
    probe = "import cupy; print(cupy.cuda.runtime.getDeviceCount())"
    try:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                             timeout=120)
        return int(out.stdout.strip() or 0)
    except (subprocess.SubprocessError, ValueError):
        return 0


GPUS = _gpus()
# the harness hides GPUs from test jobs (TensorFlow would grab them): show them to these
GPU_ENV = {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(GPUS))}
needs_gpu = pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU with CuPy; "
                               "scripts/gpu_check.sh runs these tests on a GPU machine")
needs_two = pytest.mark.skipif(GPUS < 2, reason=f"NCCL at np=2 needs two GPUs, this machine has "
                               f"{GPUS} (NCCL refuses two ranks on one GPU)")
CASES = cases()
CONFIGS = {
    "np1-nccl-cupy": (1, "cupy", {}, "Communicator", needs_gpu),
    "np1-nccl-torch": (1, "torch", {}, "Communicator", needs_gpu),
    "np2-staged-cupy": (2, "cupy", {}, "staged" if GPUS < 2 else "Communicator", needs_gpu),
    "np2-staged-forced": (2, "torch", {"HVDLIKE_GPU_TRANSPORT": "staged"}, "staged", needs_gpu),
    "np2-nccl-two-gpus": (2, "cupy", {}, "Communicator", needs_two),
}


@pytest.fixture(scope="module", params=[pytest.param(k, marks=v[4]) for k, v in CONFIGS.items()])
def job(request):
    np_, kind, env, transport, _ = CONFIGS[request.param]
    if kind == "torch" and importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch is not installed here")
    results = run_mpi(np_, "gpu_cases:run", timeout=600, env=dict(GPU_ENV, **env), kind=kind)
    for r, res in enumerate(results):
        assert res["transport"] == transport, f"rank {r}: {res['transport']}"
        assert res["kinds"] == [kind], f"rank {r} got results of kinds {res['kinds']}"
    return [res["results"] for res in results]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_gpu_collective_matches_numpy_on_every_rank(job, case):
    n = len(job)
    for rank, results in enumerate(job):
        assert_same(results[case.id], expected(case, rank, n), f"{case.id} rank {rank}")


@needs_gpu
def test_staged_path_is_chosen_with_one_warning_when_ranks_share_a_gpu():
    if GPUS >= 2:
        pytest.skip("every rank has a GPU of its own here: NCCL serves them")
    with tempfile.TemporaryDirectory() as tmp:  # run_mpi's job, keeping its output
        (Path(tmp) / "kwargs.pkl").write_bytes(pickle.dumps({}))
        job = launch(2, [sys.executable, str(WORKER), "gpu_cases:join_and_fuse", tmp], 300,
                     env=GPU_ENV)
    assert job.returncode == 0, job.output[-4000:]
    assert job.output.count("go through host memory") == 1, job.output[-4000:]
    assert "share one GPU" in job.output


@needs_gpu
@pytest.mark.parametrize("np_", [1, 2])
def test_results_follow_the_callers_stream(np_):
    for res in run_mpi(np_, "gpu_cases:streams", timeout=300, env=GPU_ENV):
        assert res["got"] == res["want"]


@needs_gpu
@pytest.mark.parametrize("np_", [1, 2])
def test_join_serves_gpu_allreduces_and_fused_steps_stay_right(np_):
    results = run_mpi(np_, "gpu_cases:join_and_fuse", timeout=300, env=GPU_ENV)
    for res in results:
        for step, got in enumerate(res["steps"]):
            want = [[[float(sum(r + step + i for r in range(np_)))] * 3] * (i + 1)
                    for i in range(4)]
            assert got == want, f"step {step}"
        assert res["last"] == 0  # rank 0 joins last, after its extra all-reduce
    assert results[0]["joined"] == [7.0] * 5


@needs_gpu
def test_bad_gpu_input_raises_the_same_error_on_every_rank():
    results = run_mpi(2, "gpu_cases:errors", timeout=300, env=GPU_ENV)
    for res in results:
        assert res["mixed"].startswith("ValueError") and "all on a GPU" in res["mixed"]
        assert res["device mismatch"].startswith("CollectiveMismatchError")
        assert "device: rank 0 has 'gpu', rank 1 has 'cpu'" in res["device mismatch"]
        assert res["adasum"].startswith("ValueError") and "Adasum on GPU arrays" in res["adasum"]
        assert res["after"] == [1.0, 1.0]
    assert results[0]["mixed"] == results[1]["mixed"]


@needs_gpu
def test_forcing_nccl_where_ranks_share_a_gpu_is_an_error_on_every_rank():
    if GPUS >= 2:
        pytest.skip("every rank has a GPU of its own here")
    results = run_mpi(2, "gpu_cases:forced_nccl", timeout=300,
                      env=dict(GPU_ENV, HVDLIKE_GPU_TRANSPORT="nccl"))
    for res in results:
        assert res.startswith("RuntimeError: HVDLIKE_GPU_TRANSPORT=nccl"), res
        assert "share one GPU" in res
