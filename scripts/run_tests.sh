#!/usr/bin/env bash
# The test command: set up .venv (idempotent), ruff, then the CPU test suite. Extra args go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh"
source "$ROOT/scripts/env.sh"
cd "$ROOT"
# Lint first (a second): the rule set is in pyproject.toml.
"$ROOT/.venv/bin/ruff" check .
exec "$ROOT/.venv/bin/python" -m pytest "$@"
