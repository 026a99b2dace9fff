#!/usr/bin/env bash
# The test command: set up .venv (idempotent), ruff, then the CPU test suite on 2 pytest-xdist workers (work
# stealing). Extra args go to pytest; they come last and win (`-n 0` runs in one process). SHOP_R1_TEST_WORKERS sets
# the worker count.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh"
source "$ROOT/scripts/env.sh"
cd "$ROOT"
# Lint first (a second): the rule set is in pyproject.toml.
"$ROOT/.venv/bin/ruff" check .
exec "$ROOT/.venv/bin/python" -m pytest -n "${SHOP_R1_TEST_WORKERS:-2}" --dist worksteal --durations=25 "$@"
