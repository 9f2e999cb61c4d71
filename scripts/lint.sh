#!/usr/bin/env bash
# The code's rules, each failing on its own: ruff (pyflakes and pycodestyle's errors, the
# library's imports sorted), import-linter's contracts (pyproject.toml: the layers, the core
# without TensorFlow, MPI only in the transports and the runtime) and mypy on the core
# (pyproject.toml's [tool.mypy]). Needs .venv with the lint extra (scripts/setup_venv.sh
# installs it).
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
.venv/bin/ruff check hvdlike scripts tests examples || status=1
.venv/bin/lint-imports --no-cache || status=1
.venv/bin/mypy || status=1
[ $status = 0 ] && echo "lint.sh: ruff, import-linter and mypy passed" || echo "lint.sh: failed" >&2
exit $status
