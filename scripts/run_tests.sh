#!/usr/bin/env bash
# Set up .venv (and the MPICH / Slurm pieces the launcher tests use), then run the whole test
# suite: real MPI jobs at np=2 and np=4.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
bash scripts/setup_test_extras.sh
export HVDLIKE_TEST_MPICH_PREFIX="$PWD/.venv-mpich"
export TF_CPP_MIN_LOG_LEVEL=2
exec .venv/bin/python -m pytest -q -rs -p no:cacheprovider tests "$@"
