"""`--dry-run`: what a run will ask of the cluster, worked out before anything is allocated.

    config -> model folder (its config.json) -> sessions (every line parsed) -> prompt budget on a sample
           -> the plan: actor groups with GPUs, CPUs, custom resources and GPU memory per actor

The placement itself is tried by `shop_r1/distributed/placement_plan.py` (the only part that talks to Ray). Nothing
here starts an engine or a learner. The memory figures are estimates from the model's shape, stated as such: weights,
gradients and optimizer states under the chosen ZeRO stage (or FSDP2, fully sharded) and the engines' KV cache per
token; activations depend on micro-batch packing and are not counted.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from shop_r1.config import Config, ConfigError, parse_resources, validate
from shop_r1.errors import DataError

GIB = 1024**3
SAMPLE_SESSIONS = 32
"""Sessions whose prompts are built and measured for the budget check (spread over the file)."""


@dataclass(frozen=True)
class ModelShape:
    """What the memory estimate needs of a model's config.json."""

    num_params: int
    num_layers: int
    kv_bytes_per_token_per_byte: int
    """2 (K and V) x layers x KV heads x head_dim: times the dtype's bytes, the KV cache of one token."""

    @classmethod
    def from_hf_config(cls, c: dict) -> ModelShape:
        h, layers, vocab = int(c["hidden_size"]), int(c["num_hidden_layers"]), int(c["vocab_size"])
        heads = int(c.get("num_attention_heads", 1))
        kv_heads = int(c.get("num_key_value_heads") or heads)
        head_dim = int(c.get("head_dim") or h // heads)
        inter = int(c.get("intermediate_size", 4 * h))
        attn = h * heads * head_dim + 2 * h * kv_heads * head_dim + heads * head_dim * h  # q, k, v, o
        per_layer = attn + 3 * h * inter + 2 * h  # gated MLP (gate, up, down) and two norms
        embed = vocab * h * (1 if c.get("tie_word_embeddings", False) else 2)
        return cls(num_params=layers * per_layer + embed + h, num_layers=layers,
                   kv_bytes_per_token_per_byte=2 * layers * kv_heads * head_dim)


@dataclass(frozen=True)
class ActorGroup:
    name: str
    """The config section that sizes it: rollout, learner, reward_pool."""
    count: int
    bundle: dict[str, float]
    """One actor's Ray resources ({"CPU": 8, "GPU": 1, ...})."""
    memory: dict[str, float] = field(default_factory=dict)
    """GPU memory per actor, GiB, by part (estimates)."""
    note: str = ""

    def render(self) -> str:
        res = ", ".join(f"{k}={v:g}" for k, v in self.bundle.items() if v)
        line = f"  {self.name}: {self.count} x {{{res or 'nothing'}}}"
        if self.memory:
            parts = ", ".join(f"{k} {v:.2f}" for k, v in self.memory.items())
            unit = "per GPU" if self.name == "rollout" else "per actor"
            line += f"\n    GPU memory {unit} (GiB, estimated): {parts}; total {sum(self.memory.values()):.2f}"
        return line + (f"\n    {self.note}" if self.note else "")


@dataclass(frozen=True)
class Plan:
    groups: tuple[ActorGroup, ...]
    checks: tuple[str, ...]
    """What was checked, one line each (model, sessions, budget)."""

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for g in self.groups:
            for k, v in g.bundle.items():
                out[k] = out.get(k, 0.0) + g.count * v
        return out

    def render(self) -> str:
        totals = ", ".join(f"{k}={v:g}" for k, v in self.totals().items() if v)
        return "\n".join(["the plan:", *[g.render() for g in self.groups], f"  in all: {totals}",
                          "checked:", *[f"  {c}" for c in self.checks]])


def model_shape(model_dir: str | Path) -> ModelShape:
    path = Path(model_dir) / "config.json"
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"model.path={model_dir}: no readable config.json there ({exc.strerror or exc}); give "
                          "an HF model folder that every node can read") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from exc
    try:
        return ModelShape.from_hf_config(raw.get("text_config", raw))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: not a decoder config this plan can size (missing {exc})") from exc


def _dtype_bytes(dtype: str, on_gpu: bool) -> int:
    """`auto` is bf16 on a GPU (the learner's and the engine's own choice), fp32 on CPU."""
    if dtype == "auto":
        return 2 if on_gpu else 4
    return 2 if dtype in ("bfloat16", "float16", "bf16", "fp16", "half") else 4


def learner_memory(cfg: Config, shape: ModelShape, with_reference: bool = True) -> dict[str, float]:
    """Per rank, GiB: weights, gradients, optimizer states (Adam's two moments in fp32, plus an fp32 master copy
    under bf16), each divided by the ranks where the ZeRO stage (or FSDP2) shards it, an offloaded optimizer holding
    no GPU memory; and GRPO's frozen reference policy, a plain module replicated on every rank
    (learner/backend.py: reference_policy), loaded whatever rl.kl_beta (SFT has none: `with_reference=False`)."""
    lc = cfg.learner
    p, b, n = shape.num_params, _dtype_bytes(lc.dtype, lc.num_gpus_per_rank > 0), lc.num_ranks
    stage = 3 if lc.backend == "fsdp2" else lc.zero_stage
    shard = {part: (n if stage >= level else 1) for part, level in (("weights", 3), ("gradients", 2),
                                                                   ("optimizer", 1))}
    optimizer = 0.0 if lc.offload_optimizer else p * (8 + (4 if b == 2 else 0)) / shard["optimizer"]
    memory = {"weights": p * b / shard["weights"], "gradients": p * b / shard["gradients"], "optimizer": optimizer,
              "reference": p * b if with_reference else 0.0}
    return {k: v / GIB for k, v in memory.items()}


def engine_memory(cfg: Config, shape: ModelShape, max_len: int) -> tuple[dict[str, float], str]:
    """Per engine GPU, GiB: the weights (split over tensor-parallel workers) and the KV cache of one full-context
    sequence per sample of a rollout batch's share; the note says how many full-context sequences fit what vLLM is
    allowed to take (rollout.gpu_memory_utilization of the card)."""
    rc = cfg.rollout
    b, tp = _dtype_bytes(rc.dtype, rc.num_gpus_per_engine > 0), max(rc.tensor_parallel_size, 1)
    weights = shape.num_params * b / tp
    per_seq = shape.kv_bytes_per_token_per_byte * b * max_len / tp
    batch_share = -(-cfg.rl.global_batch_size // max(rc.num_engines, 1))  # samples an engine holds at once
    memory = {"weights": weights / GIB, "kv_cache": per_seq * batch_share / GIB}
    note = (f"KV cache: {per_seq / GIB:.3f} GiB per {max_len}-token sequence; this engine's share of a rollout "
            f"batch is {batch_share} sequences")
    return memory, note


def plan_groups(cfg: Config, stage: str, shape: ModelShape | None, max_len: int) -> tuple[ActorGroup, ...]:
    """The actor groups `stage` (pipeline, sft, train) allocates, as the groups themselves ask for them
    (engine_group.py, learner_group.py, reward_pool.py). The pipeline's stages run one after another, so its
    largest stage (GRPO: engines, learner and reward pool at once) is what must fit."""
    rc, lc, pc = cfg.rollout, cfg.learner, cfg.reward_pool
    learner_bundle = {"CPU": float(lc.num_cpus_per_rank), "GPU": float(lc.num_gpus_per_rank),
                      **parse_resources(lc.resources, "learner.resources")}
    learner = ActorGroup("learner", lc.num_ranks, learner_bundle,
                         learner_memory(cfg, shape, with_reference=stage != "sft") if shape and lc.num_gpus_per_rank
                         else {},
                         f"backend {lc.backend}" + (f", ZeRO-{lc.zero_stage}" if lc.backend == "deepspeed" else "")
                         + f", {lc.dtype}; activations not counted")
    if stage == "sft":
        return (learner,)
    engine_bundle = {"CPU": float(rc.num_cpus_per_engine), "GPU": float(rc.num_gpus_per_engine),
                     **parse_resources(rc.resources, "rollout.resources")}
    memory, note = engine_memory(cfg, shape, max_len) if shape and rc.num_gpus_per_engine else ({}, "")
    engines = ActorGroup("rollout", rc.num_engines, engine_bundle, memory, note)
    rewards = ActorGroup("reward_pool", pc.num_workers, {"CPU": float(pc.num_cpus_per_worker),
                                                         **parse_resources(pc.resources, "reward_pool.resources")})
    return engines, learner, rewards


def check_gpu_memory(groups: tuple[ActorGroup, ...], gpu_memory_gib: float, utilization: float) -> list[str]:
    """The groups whose estimated memory per GPU exceeds what the card offers (the engines: the share vLLM may take)."""
    problems = []
    for g in groups:
        gpus = g.bundle.get("GPU", 0.0)
        if not g.memory or not gpus:
            continue
        # An engine's figures are per GPU already (split over its tensor-parallel workers); a rank's are per rank.
        offered = gpu_memory_gib * utilization if g.name == "rollout" else gpu_memory_gib * gpus
        need = sum(g.memory.values())
        if need > offered:
            key = "rollout.gpu_memory_utilization / rollout.tensor_parallel_size" if g.name == "rollout" else \
                "learner.zero_stage / learner.num_ranks / learner.offload_optimizer"
            what = "each of an engine's GPUs" if g.name == "rollout" else "a rank"
            problems.append(f"{g.name}: {what} needs ~{need:.1f} GiB of GPU memory, which offers {offered:.1f} "
                            f"(--gpu-memory-gib {gpu_memory_gib:g}); change {key}")
    return problems


def check_sessions(cfg: Config, sessions_path: str) -> tuple[list, str]:
    """Every line of the sessions source parsed (the usual FILE:LINE errors); a sample of sessions for the budget."""
    from shop_r1.data.sessions import load_sessions

    loaded = load_sessions(sessions_path, skip_bad_lines=cfg.data.skip_bad_lines)
    if len(loaded.sessions) < 2:
        raise DataError(f"{sessions_path}: {len(loaded.sessions)} usable session(s): a run needs at least 2")
    step = max(1, len(loaded.sessions) // SAMPLE_SESSIONS)
    sample = list(loaded.sessions[::step][:SAMPLE_SESSIONS])
    skipped = f" ({loaded.num_bad_lines} bad lines skipped)" if loaded.num_bad_lines else ""
    return sample, f"sessions: {sessions_path}: {len(loaded.sessions)} sessions parsed{skipped}"


def check_prompt_budget(cfg: Config, model_dir: str, sessions: list) -> str:
    """Build the RL prompts of `sessions` as `data build` would and measure them against data.max_prompt_tokens;
    a sample whose every example is over budget is an error naming the key (the run would have nothing to train)."""
    from shop_r1.data.examples import build_rl_examples, chat_token_counter
    from shop_r1.models.tokenizer import load_tokenizer

    d = cfg.data
    count = chat_token_counter(load_tokenizer(model_dir))
    built = build_rl_examples(sessions, d.context, d.max_prompt_tokens, count, d.history_rationales, d.persona,
                              d.instructions, d.persona_position)
    lengths = [count(e.prompt) for e in built.examples]
    over = len(built.over_budget_ids)
    if not lengths:
        raise DataError(f"data.max_prompt_tokens={d.max_prompt_tokens}: every one of the {over} RL examples of a "
                        f"{len(sessions)}-session sample has a current page alone over it; raise it (and "
                        "model.max_context_tokens) or use data.context=latest_step")
    return (f"prompt budget: {len(lengths)} RL prompts of {len(sessions)} sampled sessions, median "
            f"{statistics.median(lengths):.0f} / max {max(lengths)} tokens of data.max_prompt_tokens="
            f"{d.max_prompt_tokens}" + (f"; {over} over it (left out of training)" if over else ""))


def plan_run(cfg: Config, stage: str, model: str | None, sessions_path: str | None) -> Plan:
    """Everything `--dry-run` checks without Ray, in the order a run would meet it: the stage's config rules
    (shop_r1/config/validate.py: the pipeline's sessions source and split, GRPO's sampling and transport), the
    model (a folder, or a hub id sized from its config and tokenizer files alone), the context budget, the
    sessions' lines and the prompt budget on a sample. `model` None: the run builds its model itself (the
    from-scratch shop model or the embedded default), so it is not sized. `sessions_path` None: the synthetic shop,
    or (sft, train) an examples file checked by the command."""
    from shop_r1.models.hub import hub_config, is_hub_id
    from shop_r1.rollout.engine import max_model_len

    validate(cfg, stage)  # what the config and the stage decide (the pipeline: its sessions source), as the run does
    checks, shape, max_len = [], None, cfg.model.max_context_tokens
    if model and is_hub_id(model):
        checks.append(f"model: {model} is a Hugging Face id: the run downloads it once into "
                      f"{Path(cfg.run_dir) / 'hub'}; sized here from its config.json")
        model = str(hub_config(model))
    if model:
        shape = model_shape(model)
        max_len = max_model_len(cfg, model)
        checks.append(f"model: {model}: {shape.num_params / 1e6:.1f}M parameters (from config.json), context "
                      f"{max_len} tokens")
        validate(cfg, stage, max_model_len=max_len)
        checks.append("context budget: prompts + answers fit the model's context")
    else:
        checks.append("model: built by the run (model.from_scratch or the embedded default): not sized here")
    if stage == "pipeline":
        if sessions_path:
            sample, line = check_sessions(cfg, sessions_path)
            checks.append(line)
            if model:
                checks.append(check_prompt_budget(cfg, model, sample))
        else:
            checks.append(f"sessions: the synthetic shop (data.synthetic=true), {cfg.data.synth_num_sessions} "
                          f"sessions of version {cfg.data.synth_version}")
    return Plan(plan_groups(cfg, stage, shape, max_len), tuple(checks))
