#!/usr/bin/env bash
# One experiment suite (table2, table4, fig2, vocab, seeds, table5, v2_table2, v2_table4, v2_fig2): set up .venv
# (idempotent), then run it, resumably.
# Usage: bash experiments/run.sh table2 [--root DIR] [dotted.overrides ...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh"
source "$ROOT/scripts/env.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/python" "$ROOT/experiments/run.py" "$@"
