"""A resumed run is the same run: its config is compared with the run's own before anything starts.

    RUN/config.yaml            the config the run started with, written once (`save_run_config`, `start_run_config`)
    RUN/config_history.jsonl   one JSON line per event: `written` (config.yaml written afresh) or `resume` (the
                               changes a resume made: key, old, new, refused)

The run's *current* config is config.yaml with the changes of the `resume` lines after the last `written` line
applied in order (`current_run_config`); a resume compares its config with that (`check_resume`), so a change made
once (an allowed one, or a refused one forced with `--allow-config-change`) is not reported again, and going back
to the original value is a change too. config.yaml itself stays the first config; the resumed run runs with the new
one (and every checkpoint's state.json holds the config it was made with).

Which keys may change on resume. `HARMLESS` is an allow-list of dotted keys and prefixes (ending in ".") whose
change leaves the experiment as it was — how long it runs, how often it saves and logs, where it writes, what
resources and timeouts it gets, what the evaluations read:

    run_dir, storage_uri, logging.*, ray.*, eval.*, data.synthetic (a permission: the sessions are data.synth_*),
    weight_sync.* (how the weights travel, not which weights: the engines receive the same tensors),
    rl.steps (GRPO's learning rate has no schedule over rl.steps; if it gets one, take rl.steps off the list),
    rl.checkpoint_every, rl.keep_checkpoints, rl.max_restarts, rl.max_nonfinite_steps, rl.weight_sync_bucket_mb,
    rl.check_weight_sync, rl.val_every, rl.val_examples,
    sft.checkpoint_every, sft.keep_checkpoints, sft.max_restarts, sft.max_nonfinite_steps,
    rollout.num_engines, rollout.tensor_parallel_size, rollout.gpu_memory_utilization, rollout.kv_cache_gib,
    rollout.enable_prefix_caching, rollout.num_cpus_per_engine, rollout.max_engine_restarts,
    rollout.generate_timeout_s, rollout.weight_sync_timeout_s, rollout.placement_timeout_s, rollout.resources,
    rollout.weight_load (in place or layerwise: the same weights land in the engines),
    learner.step_timeout_s, learner.checkpoint_timeout_s, learner.resources, learner.max_tokens_per_micro_batch,
    learner.shared_prompt, learner.pack_sequences and learner.last_layer_at_targets (exactly equal),
    learner.gradient_checkpointing,
    learner.offload_optimizer, learner.num_cpus_per_rank,
    learner.attention (the same mask: split, block-sparse or dense),
    rollout.cpu_cores, learner.cpu_cores (where the threads run),
    reward_pool.* (workers, CPUs, timeouts, max_failed_fraction)
    rollout.num_gpus_per_engine, learner.num_gpus_per_rank: only while they stay > 0 (or stay 0): 0 <-> > 0 moves
        the engines or ranks between CPU and GPU, which with dtype=auto also changes float32 <-> bfloat16.

Every other key changes the experiment and is refused unless forced (safe default: a new field counts as changing
the experiment until someone adds it here): model.*, data.*, reward.*, seed, rl.lr, rl.global_batch_size, rl.kl_beta,
the clip/loss/scale/async settings, rollout.group_size / temperature / max_new_tokens / top_k_logprobs / dtype, the
learner's backend (a checkpoint is in its backend's format), dtype, grad_clip, weight_decay, zero_stage and num_ranks
(a ZeRO checkpoint is partitioned by rank), and the rest of sft.*.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from shop_r1.atomic import write_atomic
from shop_r1.config import RENAMED, Config, ConfigError, config_to_dict

CONFIG_FILE = "config.yaml"
HISTORY_FILE = "config_history.jsonl"
ABSENT = "<absent>"
"""Stands for a key one of the two configs does not have (a field added or removed since the run started)."""

HARMLESS: tuple[str, ...] = (
    "run_dir", "storage_uri", "logging.", "ray.", "eval.", "reward_pool.", "weight_sync.", "data.synthetic",
    "rl.steps", "rl.checkpoint_every", "rl.keep_checkpoints", "rl.max_restarts", "rl.max_nonfinite_steps",
    "rl.weight_sync_bucket_mb", "rl.check_weight_sync", "rl.val_every", "rl.val_examples",
    "sft.checkpoint_every", "sft.keep_checkpoints", "sft.max_restarts", "sft.max_nonfinite_steps",
    "rollout.num_engines", "rollout.tensor_parallel_size", "rollout.gpu_memory_utilization", "rollout.kv_cache_gib",
    "rollout.enable_prefix_caching", "rollout.num_cpus_per_engine", "rollout.max_engine_restarts",
    "rollout.generate_timeout_s", "rollout.weight_sync_timeout_s", "rollout.weight_load", "rollout.resources",
    "rollout.placement_timeout_s",
    "learner.step_timeout_s", "learner.checkpoint_timeout_s", "learner.resources", "learner.max_tokens_per_micro_batch",
    "learner.shared_prompt", "learner.pack_sequences", "learner.last_layer_at_targets",
    "learner.gradient_checkpointing",
    "learner.offload_optimizer", "learner.num_cpus_per_rank", "learner.attention", "learner.cpu_cores",
    "rollout.cpu_cores",
)
"""Dotted keys (or prefixes ending in ".") whose change on resume leaves the experiment as it was."""

DEVICE_KEYS: tuple[str, ...] = ("rollout.num_gpus_per_engine", "learner.num_gpus_per_rank")
"""Harmless while their value stays on the same side of 0 (GPU or CPU)."""


class Change(NamedTuple):
    key: str
    old: Any
    new: Any


@dataclass(frozen=True)
class ConfigDiff:
    """The keys two configs differ in, by dotted key (sorted): those that change the experiment, and the rest."""

    refused: list[Change]
    allowed: list[Change]

    def __bool__(self) -> bool:
        return bool(self.refused or self.allowed)


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"rl": {"lr": 1e-7}} -> {"rl.lr": 1e-7}."""
    flat: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, Mapping):
            flat.update(flatten(v, f"{prefix}{k}."))
        else:
            flat[f"{prefix}{k}"] = v
    return flat


def changes_experiment(key: str, old: Any, new: Any) -> bool:
    """Whether changing `key` from `old` to `new` on resume changes the experiment (see the module docstring)."""
    if key in DEVICE_KEYS:
        on_gpu = [isinstance(v, (int, float)) and v > 0 for v in (old, new)]
        return on_gpu[0] != on_gpu[1] or ABSENT in (old, new)
    return not any(key == h or (h.endswith(".") and key.startswith(h)) for h in HARMLESS)


def compare_configs(saved: Mapping[str, Any], new: Mapping[str, Any]) -> ConfigDiff:
    """Compare two configs, nested (as `config_to_dict` or a loaded config.yaml) or flat, key by dotted key; a key
    only one of them has is `ABSENT` in the other."""
    old_flat, new_flat = flatten(saved), flatten(new)
    refused, allowed = [], []
    for key in sorted(old_flat.keys() | new_flat.keys()):
        old, value = old_flat.get(key, ABSENT), new_flat.get(key, ABSENT)
        if old != value:
            (refused if changes_experiment(key, old, value) else allowed).append(Change(key, old, value))
    return ConfigDiff(refused=refused, allowed=allowed)


# ---------------------------------------------------------------------------------------------- the run folder


def current_run_config(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's current config, flat: config.yaml with the recorded resume changes applied (None: no config.yaml).
    A key config.yaml lacks (a field added since the run started) counts as its default."""
    import yaml

    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        return None
    raw = path.read_bytes()
    loaded = yaml.safe_load(raw) or {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of config sections")
    current = {**flatten(config_to_dict(Config())), **flatten(loaded)}
    for line in _history_since_written(Path(run_dir), _digest(raw)):
        for change in line.get("changes", []):
            if change["new"] == ABSENT:
                current.pop(change["key"], None)
            else:
                current[change["key"]] = change["new"]
    return _renamed(current)


def _renamed(flat: dict[str, Any]) -> dict[str, Any]:
    """A run's keys replaced since it started (`RENAMED`, e.g. rl.loss_aggregation=token) read as their successors
    (rl.loss=dapo), so a resume compares like with like. A run that has the old key predates the new one."""
    out = dict(flat)
    for old, (new, values) in RENAMED.items():
        if old in out:
            value = out.pop(old)
            out[new] = values.get(value, value)
    return out


def check_resume(run_dir: str | Path, cfg: Config, allow_change: bool, record: bool = True) -> ConfigDiff:
    """Compare `cfg` with the run's current config before a resume. No config.yaml: nothing to compare (an empty
    diff). A change of a key that changes the experiment is a `ConfigError` listing each such key with its old and
    new value, unless `allow_change`; the changes that go through are appended to config_history.jsonl (not with
    `record=False`: a dry run). config.yaml is left as it is."""
    run = Path(run_dir)
    current = current_run_config(run)
    if current is None:
        return ConfigDiff(refused=[], allowed=[])
    diff = compare_configs(current, config_to_dict(cfg))
    if diff.refused and not allow_change:
        lines = "\n".join(f"  {c.key}: {c.old!r} -> {c.new!r}" for c in diff.refused)
        raise ConfigError(
            f"resume: the config differs from the run's ({run / CONFIG_FILE}, with the changes in {HISTORY_FILE}) "
            f"in {len(diff.refused)} key(s) that change the experiment:\n{lines}\nResume with the run's values, "
            "start a new run (another run_dir), or pass --allow-config-change to change them on purpose (recorded "
            f"in {run / HISTORY_FILE}).")
    if diff and record:
        changes = [{"key": c.key, "old": c.old, "new": c.new, "refused": refused}
                   for refused, group in ((True, diff.refused), (False, diff.allowed)) for c in group]
        _append_history(run, {"event": "resume", "allow_config_change": allow_change,
                              "base": _digest((run / CONFIG_FILE).read_bytes()), "changes": changes})
    return diff


def save_run_config(run_dir: str | Path, cfg: Config) -> bool:
    """Write config.yaml only if the run has none (write-once); True when written. Atomic (temporary file, fsync,
    rename): a kill leaves no half-written config.yaml."""
    if (Path(run_dir) / CONFIG_FILE).exists():
        return False
    start_run_config(run_dir, cfg)
    return True


def start_run_config(run_dir: str | Path, cfg: Config) -> None:
    """A run starting afresh (no resume): write config.yaml, replacing any (atomically), and begin a new history
    with a `written` line, so the changes recorded for an earlier run in this folder no longer apply."""
    import yaml

    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    raw = yaml.safe_dump(config_to_dict(cfg), sort_keys=False).encode()
    write_atomic(run / CONFIG_FILE, raw)
    _append_history(run, {"event": "written", "base": _digest(raw)})


def _digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def _history_since_written(run: Path, base: str) -> list[dict[str, Any]]:
    """The `resume` lines after the last `written` line, made on this config.yaml (`base`: its sha256; a line made
    on another config.yaml, e.g. one a writer replaced without a `written` line, does not apply)."""
    path = run / HISTORY_FILE
    if not path.is_file():
        return []
    lines: list[dict[str, Any]] = []
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}:{number}: not a JSON line ({e.msg}); fix or remove that line") from None
        if line.get("event") == "written":
            lines = []
        elif line.get("event") == "resume" and line.get("base") == base:
            lines.append(line)
    return lines


def _append_history(run: Path, record: dict[str, Any]) -> None:
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    with open(run / HISTORY_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps({"time": now, **record}) + "\n")  # one write: a line is whole or absent
        f.flush()
        os.fsync(f.fileno())

