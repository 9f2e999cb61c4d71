#!/usr/bin/env bash
# Set up .venv (and the MPICH / Slurm pieces the launcher tests use), then run the whole test
# suite: real MPI jobs at np=2 and np=4.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
bash scripts/setup_test_extras.sh
export HVDLIKE_TEST_MPICH_PREFIX="$PWD/.venv-mpich"
export TF_CPP_MIN_LOG_LEVEL=2
# two pytest workers (pytest-xdist), each test file whole on one of them (its module fixtures,
# such as the test cluster, set up once): most jobs wait on MPI, sleeps and timeouts more than
# they compute, so two at a time fill the two cores
start=$(date +%s)
status=0
.venv/bin/python -m pytest -q -rs -p no:cacheprovider -n 2 --dist loadfile tests "$@" || status=$?
echo "run_tests.sh: the suite took $(( $(date +%s) - start )) s (pytest exit status $status)"
exit $status
