# Environment for running shop-r1 on this kind of machine (CPU, offline). Sourced by the run scripts.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
export WANDB_MODE="${WANDB_MODE:-offline}"
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-2}"
export VLLM_ENABLE_V1_MULTIPROCESSING="${VLLM_ENABLE_V1_MULTIPROCESSING:-0}"
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/shop_r1/torch_extensions}"
