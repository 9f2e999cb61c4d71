#!/usr/bin/env bash
# Create (or update) the project's virtual environment in .venv with hvdlike and the extras
# named (default: everything the examples, tests and benchmarks need). Idempotent; safe to run
# on a fresh machine. Says what it installs: the first time takes a minute or two.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
EXTRAS=${1:-tf,test,lint,docs,autotune}
[ -x .venv/bin/python ] || { echo "setup_venv: creating .venv with $("$PYTHON" --version)"; \
                             "$PYTHON" -m venv .venv; }
echo "setup_venv: installing hvdlike[$EXTRAS] into .venv (pip; the first time downloads" \
     "TensorFlow and the MPI wheels)"
.venv/bin/python -m pip install -q -e ".[$EXTRAS]" 2>&1 | { grep -v "^WARNING: Location" || true; }
.venv/bin/python -c "import hvdlike, mpi4py, numpy" \
  || { echo "setup failed: see the pip output above" >&2; exit 1; }
echo "setup_venv: ready"
