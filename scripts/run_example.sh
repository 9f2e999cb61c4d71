#!/usr/bin/env bash
# The main job: set up .venv, then train the example under `hvdlikerun -np 2` on synthetic data.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
exec .venv/bin/hvdlikerun -np "${NP:-2}" .venv/bin/python examples/numpy_data_parallel.py "$@"
