#!/usr/bin/env bash
# The main job: set up .venv, then train a Keras CNN with model.fit under `hvdlikerun -np 2`
# (synthetic MNIST-shaped data; pass --data mnist.npz for the real thing).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh tf  # what the example needs; the tests install the rest
exec .venv/bin/hvdlikerun -np "${NP:-2}" .venv/bin/python examples/keras_mnist.py "$@"
