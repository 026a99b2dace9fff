"""Whether two configs are the same experiment, shared by experiments/run.py (workspaces, --adopt, --carry) and
experiments/summarize.py (--carry): here, so neither imports the other."""

from __future__ import annotations

import time
from pathlib import Path

from experiments.suites import seed_workspace
from shop_r1.config import Config, ConfigError, config_to_dict, load_config

ROOT = Path(__file__).resolve().parent.parent


def seed_overrides(root: Path, k: int) -> tuple[str, ...]:
    return f"seed={k}", f"data.synth_seed={k}", f"run_dir={seed_workspace(root, k)}"


# Keys that do not change a result: a workspace made with other values of these is still the same experiment.
NOT_RESULTS = ("run_dir", "storage_uri", "logging.", "ray.")
SAME_RESULTS = ("learner.attention", "learner.shared_prompt", "learner.pack_sequences", "learner.last_layer_at_targets",
                "learner.max_tokens_per_micro_batch", "data.synthetic")
"""How the learner lays out and runs its forwards: the same logprobs and gradients (tested), so a workspace or a
carried table made before one of these changed (e.g. learner.attention's default) is the same experiment.
`data.synthetic` only permits the synthetic shop that an empty data.sessions_path always meant before it existed."""


def _flat(tree: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in tree.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def config_changes(saved: Config, cfg: Config) -> list[str]:
    """`key: saved -> new` for every setting that differs and can change a result: not the paths and logging, nor
    the learner's forwards whose outputs and gradients are exactly equal (SAME_RESULTS)."""
    a, b = _flat(config_to_dict(saved)), _flat(config_to_dict(cfg))
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k) and not k.startswith(NOT_RESULTS) and k not in SAME_RESULTS]


def with_overrides(cfg: Config, overrides: list[str] | tuple[str, ...]) -> Config:
    """A copy of `cfg` with dotted overrides applied (validated like the CLI's)."""
    import yaml

    tmp = Path(cfg.run_dir if Path(cfg.run_dir).is_absolute() else ROOT / cfg.run_dir).parent
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / f".cfg-{time.monotonic_ns()}.yaml"
    path.write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
    try:
        return load_config(path, list(overrides))
    finally:
        path.unlink()


def check_carry(carry: Path, base: Config, root: Path) -> None:
    """An earlier summary's seeds join this run's table only if it was made with this config (seeds aside)."""
    path = carry / "config.yaml"
    if not path.exists():
        raise ConfigError(f"--carry {carry}: no config.yaml there (not a v2 suite's results folder)")
    saved = load_config(path)
    changes = config_changes(saved, with_overrides(base, seed_overrides(root, saved.seed)))
    if changes:
        raise ConfigError(f"--carry {carry}: made with another config ({'; '.join(changes)})")
