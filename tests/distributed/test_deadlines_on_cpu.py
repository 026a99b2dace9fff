"""The timeouts derived from the work (shop_r1/distributed/deadlines.py), worked out by hand."""

import subprocess
import sys

import pytest

from shop_r1.config import RANGES, Config
from shop_r1.distributed import deadlines
from shop_r1.distributed.actors import ActorTimeout, is_actor_death

GB = 1_000_000_000


def test_weight_sync_is_a_fixed_part_plus_the_bytes_at_50_mb_per_s():
    # 0 bytes: the fixed 300 s alone; each collective half of it.
    assert deadlines.weight_sync_timeouts(0) == deadlines.SyncTimeouts(300.0, 150.0)
    # A 3B model in bf16, ~6 GB: 300 + 6e9 / 5e7 = 300 + 120 = 420 s; collectives 210 s.
    assert deadlines.weight_sync_timeouts(6 * GB) == deadlines.SyncTimeouts(420.0, 210.0)
    # A 7B model in bf16, ~15 GB: 300 + 300 = 600 s.
    assert deadlines.weight_sync_timeouts(15 * GB).push_s == 600.0


def test_a_set_timeout_replaces_the_derived_one_whatever_the_bytes():
    assert deadlines.weight_sync_timeouts(15 * GB, override_s=10.0) == deadlines.SyncTimeouts(10.0, 5.0)
    assert deadlines.learner_step_timeout_s(10**9, override_s=30.0) == 30.0
    assert deadlines.checkpoint_timeout_s(100 * GB, override_s=45.0) == 45.0


def test_learner_step_is_ten_minutes_plus_the_tokens_per_rank_at_100_per_s():
    assert deadlines.learner_step_timeout_s(0) == 600.0
    # The default GRPO batch, 64 responses padded to 4,096 tokens, on one rank: 262,144 tokens -> 600 + 2,621.44 s.
    assert deadlines.learner_step_timeout_s(64 * 4096) == pytest.approx(3221.44)
    # The same batch on 8 ranks: 32,768 tokens each -> 600 + 327.68 s.
    assert deadlines.learner_step_timeout_s(8 * 4096) == pytest.approx(927.68)


def test_checkpoint_is_ten_minutes_plus_eight_times_the_model_bytes_at_50_mb_per_s():
    assert deadlines.checkpoint_timeout_s(0) == 600.0
    # 6 GB of bf16 weights -> a 48 GB checkpoint (weights, fp32 master, two Adam moments): 600 + 48e9 / 5e7 = 1,560 s.
    assert deadlines.checkpoint_timeout_s(6 * GB) == 1560.0


def test_start_is_ten_minutes_plus_every_model_loaded():
    assert deadlines.start_timeout_s(0) == 600.0
    assert deadlines.start_timeout_s(6 * GB) == 720.0  # one model: 6e9 / 5e7 = 120 s
    assert deadlines.start_timeout_s(6 * GB, copies=2) == 840.0  # a learner: the policy and the reference


def test_negative_work_is_an_error():
    with pytest.raises(ValueError, match="negative work"):
        deadlines.weight_sync_timeouts(-1)


def test_model_bytes_counts_the_weight_files_only(tmp_path):
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"x" * 1000)
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"x" * 500)
    (tmp_path / "pytorch_model.bin").write_bytes(b"x" * 30)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_bytes(b"x" * 7000)
    assert deadlines.model_bytes(tmp_path) == 1530
    assert deadlines.model_bytes(tmp_path / "missing") == 0 and deadlines.model_bytes("") == 0


def test_explain_names_the_key_and_how_it_was_set():
    assert deadlines.explain("rollout.weight_sync_timeout_s", 8.0) == "rollout.weight_sync_timeout_s=8"
    assert deadlines.explain("learner.step_timeout_s", 0.0).startswith("learner.step_timeout_s=0: derived")


def test_timeout_fields_default_to_derived_and_refuse_negatives():
    cfg = Config()
    assert (cfg.rollout.weight_sync_timeout_s, cfg.learner.step_timeout_s, cfg.learner.checkpoint_timeout_s) == \
        (0.0, 0.0, 0.0)
    for key in ("rollout.weight_sync_timeout_s", "learner.step_timeout_s", "learner.checkpoint_timeout_s"):
        assert 0.0 in RANGES[key] and 5.0 in RANGES[key] and -1.0 not in RANGES[key]


def test_an_actor_timeout_counts_as_the_actors_death():
    # A hung actor no longer answers: the drivers' restart path treats it as a dead one.
    assert is_actor_death(ActorTimeout("learner grpo_step: not done within 600 s"))
    assert not is_actor_death(RuntimeError("an error the method raised"))


def test_deadlines_import_neither_ray_nor_torch():
    code = ("import sys; import shop_r1.distributed.deadlines; "
            "print(sorted(m for m in ('ray', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
