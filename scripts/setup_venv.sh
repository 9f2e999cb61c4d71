#!/usr/bin/env bash
# Create (or update) the project's virtual environment in .venv with everything the examples,
# tests and benchmarks need. Idempotent; safe to run on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q -e ".[tf,test,lint,docs,autotune]" 2>&1 | { grep -v "^WARNING: Location" || true; }
.venv/bin/python -c "import hvdlike, mpi4py, numpy, pytest" \
  || { echo "setup failed: see the pip output above" >&2; exit 1; }
