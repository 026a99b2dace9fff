"""run_grpo(engines=...) takes a caller's running engine group only when it is what the run would have started: the
checks name each mismatch, before any actor of the run starts. (Runs on a given group: tests/distributed/
test_grpo_on_cpu.py's module-scoped `engines`.)"""

import dataclasses
from types import SimpleNamespace

import pytest

from shop_r1.config import load_config
from shop_r1.train import check_given_engines


def _group(cfg, context, local=False, count=1, rollout=None):
    return SimpleNamespace(engines=[object()] * count, local=local, max_model_len=context,
                           cfg=rollout if rollout is not None else cfg.rollout)


def test_a_group_built_for_the_run_is_taken_and_each_mismatch_is_named(tiny_model_dir):
    from shop_r1.rollout.engine import max_model_len

    cfg = load_config(None, ["rollout.kv_cache_gib=1", "rollout.temperature=0.6"])
    context = max_model_len(cfg, str(tiny_model_dir))
    check_given_engines(_group(cfg, context), cfg, str(tiny_model_dir), local=False, engine_cls=None)
    # Per-request settings (temperature, new tokens, group size) travel with each generate call: they may differ.
    sampling = dataclasses.replace(cfg.rollout, temperature=1.0, max_new_tokens=7, group_size=2)
    check_given_engines(_group(cfg, context, rollout=sampling), cfg, str(tiny_model_dir), local=False,
                        engine_cls=None)

    built = dataclasses.replace(cfg.rollout, kv_cache_gib=2.0, enable_prefix_caching=False)
    with pytest.raises(ValueError) as err:
        check_given_engines(_group(cfg, context - 1, local=True, count=2, rollout=built), cfg, str(tiny_model_dir),
                            local=False, engine_cls=object)
    message = str(err.value)
    for part in ("engine_cls is given as well", "they run in-process, the run is under Ray",
                 "2 engine(s), rollout.num_engines=1",
                 f"their context is {context - 1} tokens, the run needs {context}",
                 "rollout.kv_cache_gib: 2.0 vs 1.0", "rollout.enable_prefix_caching: False vs True"):
        assert part in message, (part, message)
    assert "temperature" not in message
