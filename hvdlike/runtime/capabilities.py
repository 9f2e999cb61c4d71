"""What this build of hvdlike can do, under Horovod's names (``hvdlike.nccl_built()``, ...)."""
import importlib.util

from . import is_initialized, state


def mpi_threads_supported() -> bool:
    """True when MPI runs with MPI_THREAD_MULTIPLE."""
    st = state("hvdlike.mpi_threads_supported()")
    return st.mpi.Query_thread() == st.mpi.THREAD_MULTIPLE


def mpi_enabled() -> bool:
    """True once hvdlike runs on MPI (always, after init)."""
    return is_initialized()


def mpi_built() -> bool:
    """True when mpi4py is installed."""
    return importlib.util.find_spec("mpi4py") is not None


def nccl_built() -> bool:
    """True when CuPy and its NCCL library load, so GPU arrays can travel through NCCL."""
    from ..transport import gpu

    return gpu.nccl_available()


def cuda_built() -> bool:
    """True when CuPy loads and sees a GPU (GPU arrays can be passed to collectives)."""
    from ..transport import gpu

    return gpu.cuda_available()


def gpu_available(ext_base_name: str = "tensorflow", verbose: bool = False) -> bool:
    """Horovod's ``gpu_available``: whether GPU arrays can be reduced here (``cuda_built``);
    ``ext_base_name`` and ``verbose`` are accepted for Horovod's signature."""
    return cuda_built()


def ccl_built() -> bool:
    """Always False: hvdlike has no oneCCL path."""
    return False


def ddl_built() -> bool:
    """Always False: hvdlike has no IBM DDL path."""
    return False


def rocm_built() -> bool:
    """Always False: hvdlike's GPU path is CUDA (CuPy, NCCL)."""
    return False


def sycl_built() -> bool:
    """Always False: hvdlike has no SYCL (Intel GPU) path."""
    return False


def gloo_enabled() -> bool:
    """Always False: hvdlike runs on MPI only."""
    return False


def gloo_built() -> bool:
    """Always False: hvdlike has no Gloo controller."""
    return False
