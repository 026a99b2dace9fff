"""The main job, `shop-r1 pipeline`: every stage that exists, in order, on the configured (default: embedded) setup.

Stages so far: models (the embedded SmolLM2-135M-Instruct and the tiny test model) -> sessions (synthetic unless
`data.sessions_path` is given) -> SFT/RL examples with their statistics. Later stages (zero-shot eval, SFT, GRPO,
eval) append here. Every artefact lands in `run_dir`, starting with the resolved config.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from shop_r1.config import Config, save_config


def default_model_dir() -> Path:
    """Where the embedded default model is imported once and reused (override with SHOP_R1_CACHE)."""
    cache = Path(os.environ.get("SHOP_R1_CACHE", Path.home() / ".cache" / "shop_r1"))
    return cache / "models" / "smollm2-135m-instruct"


@contextmanager
def _stage(name: str) -> Iterator[None]:
    print(f"==> {name} ...", flush=True)
    start = time.perf_counter()
    yield
    print(f"<== {name} done in {time.perf_counter() - start:.1f}s", flush=True)


@dataclass(frozen=True)
class PipelineResult:
    run_dir: str
    model_dir: str
    tiny_model_dir: str
    sessions_path: str
    data_dir: str


def run_pipeline(cfg: Config) -> PipelineResult:
    from shop_r1.data.build import build_datasets
    from shop_r1.data.sessions import write_sessions
    from shop_r1.data.stats import session_stats
    from shop_r1.data.synth import synthesize_sessions
    from shop_r1.models.smollm2 import import_smollm2
    from shop_r1.models.tiny import build_tiny_model

    run = Path(cfg.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run / "config.yaml")
    print(f"run folder: {run.resolve()}")

    with _stage("models"):
        model_dir = Path(cfg.model.path) if cfg.model.path else import_smollm2(default_model_dir())
        tiny_dir = build_tiny_model(run / "models" / "tiny", seed=cfg.seed)
        print(f"  policy model: {model_dir}\n  tiny test model: {tiny_dir}")

    with _stage("sessions"):
        if cfg.data.sessions_path:
            sessions_path = Path(cfg.data.sessions_path)
            print(f"  using {sessions_path}")
        else:
            sessions = synthesize_sessions(cfg.data.synth_num_sessions, cfg.data.synth_seed)
            sessions_path = run / "data" / "sessions.jsonl"
            write_sessions(sessions, sessions_path)
            print(session_stats(sessions).render(f"  synthesized -> {sessions_path}"))

    with _stage("examples"):
        built = build_datasets(sessions_path, run / "data", model_dir, cfg.data, seed=cfg.seed)
        print(built.render())

    return PipelineResult(run_dir=str(run), model_dir=str(model_dir), tiny_model_dir=str(tiny_dir),
                          sessions_path=str(sessions_path), data_dir=built.out_dir)
