#!/usr/bin/env bash
# What the tests need beyond .venv: an MPICH environment (.venv-mpich: the launcher tests, and
# hvdlike's collectives run under MPICH with this checkout on PYTHONPATH) and, as root
# with apt, Debian's Slurm (the tests start their own one-node cluster from it). A step that
# cannot be done here is reported; the tests that need it then skip and say why.
set -uo pipefail
cd "$(dirname "$0")/.."
if ! .venv-mpich/bin/python -c "import ml_dtypes" 2>/dev/null; then
  { python3 -m venv .venv-mpich && .venv-mpich/bin/pip install -q mpich mpi4py numpy 'ml_dtypes<0.7' \
      >.venv-mpich/install.log 2>&1; } \
    || echo "setup_test_extras: MPICH install failed (see .venv-mpich/install.log)" >&2
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! command -v slurmctld >/dev/null; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      slurm-wlm munge libpmix-dev >/dev/null; } || echo "setup_test_extras: Slurm install failed" >&2
fi
exit 0
