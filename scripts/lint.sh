#!/usr/bin/env bash
# The code's rules, each failing on its own: ruff (pyflakes and pycodestyle's errors, the
# library's imports sorted) and import-linter's contracts (pyproject.toml: the layers, the core
# without TensorFlow, MPI only in the transports and the runtime). Needs .venv with the lint
# extra (scripts/setup_venv.sh installs it).
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
.venv/bin/ruff check hvdlike scripts tests examples || status=1
.venv/bin/lint-imports --no-cache || status=1
[ $status = 0 ] && echo "lint.sh: ruff and import-linter passed" || echo "lint.sh: failed" >&2
exit $status
