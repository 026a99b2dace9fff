#!/usr/bin/env bash
# The main job on the embedded default: set up .venv (idempotent), then run the pipeline.
# Extra args are dotted config overrides or CLI flags, e.g. `bash scripts/run_main.sh data.synth_num_sessions=50`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh"
source "$ROOT/scripts/env.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/shop-r1" pipeline --config "$ROOT/configs/demo_cpu.yaml" "$@"
