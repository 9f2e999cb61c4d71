#!/usr/bin/env bash
# Set up .venv, then run the whole test suite (real MPI jobs at np=2 and np=4).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider tests "$@"
