#!/usr/bin/env bash
# The benchmark suite on this machine: set up .venv (idempotent), then run every benchmark side by side with its
# reference and write benchmarks/results/<machine>/ (results.json, README.md, plots).
# Extra args go to benchmarks/run_suite.py, e.g. `--quick` or `--only rouge,reward_pool`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh"
source "$ROOT/scripts/env.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/python" "$ROOT/benchmarks/run_suite.py" "$@"
