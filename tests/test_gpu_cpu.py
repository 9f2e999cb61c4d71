"""The GPU path's logic that needs no GPU: which inputs count as GPU arrays, the transport
setting, the errors when CuPy or NCCL is missing, GPU choice per local rank, shared-GPU
detection, NCCL's dtype coverage; and that host arrays are untouched by all of it."""
import importlib.util

import numpy as np
import pytest

from hvdlike.base import dtypes
from hvdlike.transport import gpu
from hvdlike.base.settings import Settings
from hvdlike.transport import nccl
from mpi_harness import run_mpi

HAS_CUPY = importlib.util.find_spec("cupy") is not None


@pytest.mark.parametrize("value", ["auto", "nccl", "staged", "NCCL"])
def test_gpu_transport_setting_takes_its_three_values(value):
    assert Settings.from_env({"HVDLIKE_GPU_TRANSPORT": value}).gpu_transport == value.lower()


def test_gpu_transport_setting_rejects_anything_else():
    with pytest.raises(ValueError, match="HVDLIKE_GPU_TRANSPORT='mpi' is not one of auto, "
                                         "nccl, staged"):
        Settings.from_env({"HVDLIKE_GPU_TRANSPORT": "mpi"})
    assert Settings.from_env({}).gpu_transport == "auto"


@pytest.mark.parametrize("value", [np.ones(3), np.float32(2.0), [1, 2], 3.0, np.ones((2, 2))[:, 0]])
def test_host_values_are_not_gpu_arrays(value):
    assert not gpu.is_device_array(value)
    assert gpu.device_kind([value, value]) == ("cpu", None)


def test_results_go_back_through_the_callers_library():
    assert gpu._restorer(np.ndarray) is np.from_dlpack
    assert gpu._restorer(int)(5) == 5  # no from_dlpack there: the result as it is


@pytest.mark.skipif(HAS_CUPY, reason="CuPy is installed here: the missing-CuPy error cannot show")
def test_missing_cupy_names_what_to_install():
    with pytest.raises(ImportError, match=r"cupy-cuda12x and nvidia-nccl-cu12 .*hvdlike\[gpu\]"):
        gpu.nccl_module()
    assert not gpu.nccl_available() and not gpu.cuda_available()


def test_each_local_rank_gets_its_own_gpu_and_extra_ranks_share_round_robin():
    assert [gpu.gpu_for(r, 2) for r in range(5)] == [0, 1, 0, 1, 0]
    assert [gpu.gpu_for(r, 8) for r in range(3)] == [0, 1, 2]
    assert gpu.gpu_for(0, 0) is None


def test_shared_gpus_are_found_by_identity():
    assert nccl.shares_gpu(["a", "b", "c"]) == []
    assert nccl.shares_gpu(["a", "b", "a", "a"]) == [("a", [0, 2, 3])]


def test_nccl_reduces_every_supported_dtype():
    for d in dtypes.SUPPORTED:
        assert nccl.reduce_dtype(d) in nccl._TYPES, d
    assert nccl.reduce_dtype(np.dtype(np.int16)) == np.int32
    assert nccl.reduce_dtype(np.dtype(np.bool_)) == np.uint8
    assert nccl.reduce_dtype(np.dtype(np.float16)) == np.float16  # NCCL reduces it natively
    assert nccl.reduce_dtype(dtypes.BFLOAT16) == np.float32


@pytest.mark.skipif(HAS_CUPY, reason="CuPy is installed here: this checks a machine without it")
@pytest.mark.parametrize("transport", ["auto", "nccl"])
def test_without_a_gpu_pin_gpu_does_nothing_and_host_arrays_take_the_host_path(transport):
    results = run_mpi(2, "gpu_host_cases:no_gpu", timeout=120,
                      env={"HVDLIKE_GPU_TRANSPORT": transport})
    for res in results:
        assert res == {"pinned": None, "nccl": False, "cuda": False, "sum": [3.0] * 4,
                       "transport": transport}
