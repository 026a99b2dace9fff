"""shop-r1: train LLMs to simulate online shoppers with RL (the Shop-R1 method, ICLR 2026).

The Python API beside the CLI (each name is imported on first use, so `import shop_r1` stays light):

    from shop_r1 import load_config, run_pipeline
    cfg = load_config("configs/demo_cpu.yaml", ["run_dir=runs/mine", "rl.steps=20"])
    result = run_pipeline(cfg)           # data -> zero-shot eval -> SFT -> eval -> GRPO -> eval, the table
    print(result.table)

`run_sft`, `run_grpo` and `run_eval` (`shop_r1.evaluate.evaluate`) run one stage each (they need Ray started:
`start_ray(cfg.ray)`).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_API = {
    "load_config": "shop_r1.config", "Config": "shop_r1.config", "run_pipeline": "shop_r1.pipeline",
    "run_sft": "shop_r1.sft", "run_grpo": "shop_r1.train", "run_eval": "shop_r1.evaluate",
    "start_ray": "shop_r1.distributed.runtime", "score_response": "shop_r1.reward.scorer",
    "build_datasets": "shop_r1.data.build", "make_report": "shop_r1.report",
}
__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'shop_r1' has no attribute {name!r}")
    return getattr(import_module(_API[name]), "evaluate" if name == "run_eval" else name)
