"""`--dry-run`'s plan (shop_r1/plan.py) and its placement arithmetic (shop_r1/distributed/placement_plan.py
`shortfalls`): pure, no Ray, no model. Expected values are worked out by hand in the comments, on Qwen2.5-3B's shape
and the committed one-node A100 config."""

import json
from pathlib import Path

import pytest

from shop_r1.config import ConfigError, load_config
from shop_r1.data.sessions import write_sessions
from shop_r1.data.synth import synthesize_sessions
from shop_r1.distributed.placement_plan import shortfalls
from shop_r1.errors import DataError
from shop_r1.plan import (
    GIB,
    ModelShape,
    Plan,
    check_gpu_memory,
    check_sessions,
    engine_memory,
    learner_memory,
    model_shape,
    plan_groups,
    plan_run,
)

A100 = str(Path(__file__).resolve().parents[1] / "configs" / "cluster" / "a100-1node.yaml")

# Qwen2.5-3B(-Instruct)'s config.json, the fields the plan reads.
QWEN25_3B = {"hidden_size": 2048, "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2,
             "intermediate_size": 11008, "vocab_size": 151936, "tie_word_embeddings": True,
             "max_position_embeddings": 32768}
# head_dim = 2048 / 16 = 128.
# Per layer:
#   attention  q 2048*16*128 + k, v 2 * 2048*2*128 + o 16*128*2048 = 4_194_304 + 1_048_576 + 4_194_304 = 9_437_184
#   gated MLP  3 * 2048 * 11008                                                                    = 67_633_152
#   two norms  2 * 2048                                                                            =      4_096
#                                                                                                  = 77_074_432
# 36 layers 2_774_679_552 + tied embedding 151936 * 2048 = 311_164_928 + final norm 2048 = 3_085_846_528 (~3.09e9).
# Qwen2's q/k/v biases (2048 + 256 + 256 per layer, 92_160 in all) are not counted: the published 3_085_938_688
# is 92_160 more, 0.003%.
QWEN25_3B_PARAMS = 3_085_846_528
P = QWEN25_3B_PARAMS


@pytest.fixture(scope="module")
def qwen() -> ModelShape:
    return ModelShape.from_hf_config(QWEN25_3B)


def test_qwen25_3b_shape(qwen):
    assert qwen.num_params == QWEN25_3B_PARAMS
    assert qwen.num_params == pytest.approx(3.09e9, rel=2e-3)
    assert qwen.num_layers == 36
    assert qwen.kv_bytes_per_token_per_byte == 2 * 36 * 2 * 128 == 18_432  # K and V x layers x KV heads x head_dim


def test_untied_embeddings_count_the_output_head_too():
    untied = ModelShape.from_hf_config({**QWEN25_3B, "tie_word_embeddings": False})
    assert untied.num_params == QWEN25_3B_PARAMS + 151936 * 2048  # lm_head: 311_164_928 more


def test_model_shape_reads_a_model_folders_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"text_config": QWEN25_3B}))  # a multimodal wrapper
    assert model_shape(tmp_path).num_params == QWEN25_3B_PARAMS
    with pytest.raises(ConfigError, match=r"model.path=.*: no readable config.json there"):
        model_shape(tmp_path / "nothing_here")


# ---------------------------------------------------------------------------------------------- learner memory

# Bytes per parameter on one of 4 ranks: weights, gradients, optimizer (Adam's two fp32 moments, 8 bytes, plus an
# fp32 master copy, 4, under bf16), each divided by the ranks from its ZeRO stage on (optimizer >= 1, gradients >= 2,
# weights >= 3; FSDP2 shards all, as stage 3); the reference policy is replicated on every rank (never divided).
LEARNER_BYTES_PER_PARAM = {
    # (backend, zero_stage, dtype):   weights gradients optimizer reference
    ("deepspeed", 0, "bfloat16"): (2, 2, 12, 2),
    ("deepspeed", 1, "bfloat16"): (2, 2, 12 / 4, 2),
    ("deepspeed", 2, "bfloat16"): (2, 2 / 4, 12 / 4, 2),
    ("deepspeed", 3, "bfloat16"): (2 / 4, 2 / 4, 12 / 4, 2),  # 6 bytes: 18_515_079_168 B = 17.24 GiB
    ("fsdp2", 0, "bfloat16"): (2 / 4, 2 / 4, 12 / 4, 2),  # zero_stage does not apply: fully sharded
    ("deepspeed", 0, "float32"): (4, 4, 8, 4),  # no master copy: the weights are fp32 already
    ("deepspeed", 3, "float32"): (4 / 4, 4 / 4, 8 / 4, 4),
}


@pytest.mark.parametrize("key", list(LEARNER_BYTES_PER_PARAM))
def test_learner_memory_shards_each_part_from_its_stage_on(qwen, key):
    backend, stage, dtype = key
    cfg = load_config(None, [f"learner.backend={backend}", f"learner.zero_stage={stage}", f"learner.dtype={dtype}",
                             "learner.num_ranks=4"])
    weights, gradients, optimizer, reference = LEARNER_BYTES_PER_PARAM[key]
    assert learner_memory(cfg, qwen) == pytest.approx({
        "weights": P * weights / GIB, "gradients": P * gradients / GIB, "optimizer": P * optimizer / GIB,
        "reference": P * reference / GIB}, rel=1e-12)


def test_zero3_bf16_on_4_ranks_is_about_17_gib_per_rank(qwen):
    cfg = load_config(None, ["learner.zero_stage=3", "learner.dtype=bfloat16", "learner.num_ranks=4"])
    # 6 bytes x 3_085_846_528 = 18_515_079_168 B / 2**30 = 17.2435 GiB.
    assert sum(learner_memory(cfg, qwen).values()) == pytest.approx(17.2435, abs=1e-4)


def test_an_offloaded_optimizer_holds_no_gpu_memory(qwen):
    cfg = load_config(None, ["learner.zero_stage=2", "learner.dtype=bfloat16", "learner.num_ranks=4",
                             "learner.offload_optimizer=true"])
    memory = learner_memory(cfg, qwen)
    assert memory["optimizer"] == 0.0
    assert memory["gradients"] == pytest.approx(P * 2 / 4 / GIB)  # the rest as without offload
    assert memory["weights"] == memory["reference"] == pytest.approx(P * 2 / GIB)


def test_sft_holds_no_reference_policy_and_grpo_always_does(qwen):
    cfg = load_config(None, ["learner.zero_stage=3", "learner.dtype=bfloat16", "learner.num_ranks=4",
                             "rl.kl_beta=0"])
    assert learner_memory(cfg, qwen, with_reference=False)["reference"] == 0.0
    # GRPO loads it whatever rl.kl_beta (train.py passes the policy as reference_path): counted.
    assert learner_memory(cfg, qwen)["reference"] == pytest.approx(P * 2 / GIB)
    assert learner_memory(cfg, qwen)["weights"] == pytest.approx(P * 2 / 4 / GIB)


# ---------------------------------------------------------------------------------------------- engine memory


def test_engine_memory_splits_weights_and_kv_cache_over_tensor_parallel_workers(qwen):
    cfg = load_config(None, ["rollout.tensor_parallel_size=2", "rollout.num_gpus_per_engine=2",
                             "rollout.dtype=bfloat16", "rollout.num_engines=3"])
    memory, note = engine_memory(cfg, qwen, 32768)
    # weights: 3_085_846_528 x 2 bytes / 2 GPUs = 3_085_846_528 B = 2.874 GiB per GPU.
    assert memory["weights"] == pytest.approx(P / GIB) == pytest.approx(2.8739, abs=1e-4)
    # One 32768-token sequence: 18_432 x 2 bytes x 32768 / 2 GPUs = 603_979_776 B = 0.5625 GiB; an engine's share
    # of the 64-sample batch over 3 engines is ceil(64 / 3) = 22 sequences: 22 x 0.5625 = 12.375 GiB.
    assert memory["kv_cache"] == 12.375
    assert note == ("KV cache: 0.562 GiB per 32768-token sequence; this engine's share of a rollout batch is 22 "
                    "sequences")


# ---------------------------------------------------------------------------------------------- actor groups


@pytest.fixture(scope="module")
def a100():
    return load_config(A100, ["data.synthetic=true"])


def test_sft_asks_for_the_learner_only(a100, qwen):
    (learner,) = plan_groups(a100, "sft", qwen, 32768)
    assert (learner.name, learner.count, learner.bundle) == ("learner", 4, {"CPU": 8.0, "GPU": 1.0})
    # ZeRO-3, bf16, 4 ranks (above) and no reference policy: 0.5 + 0.5 + 3 = 4 bytes a parameter.
    assert sum(learner.memory.values()) == pytest.approx(P * 4 / GIB) and learner.memory["reference"] == 0.0
    assert Plan((learner,), ()).totals() == {"CPU": 32.0, "GPU": 4.0}


def test_the_pipeline_asks_for_engines_learner_and_reward_pool(a100, qwen):
    groups = plan_groups(a100, "pipeline", qwen, 32768)
    assert [(g.name, g.count, g.bundle) for g in groups] == [
        ("rollout", 4, {"CPU": 8.0, "GPU": 1.0}),
        ("learner", 4, {"CPU": 8.0, "GPU": 1.0}),
        ("reward_pool", 8, {"CPU": 1.0}),
    ]
    # CPUs: 4x8 + 4x8 + 8x1 = 72 (the config's header says so); GPUs: 4 engines + 4 ranks = 8.
    assert Plan(groups, ()).totals() == {"CPU": 72.0, "GPU": 8.0}
    # An engine, bf16, TP 1: weights 2 x P = 5.748 GiB; one 32768-token sequence 18_432 x 2 x 32768 B = 1.125 GiB,
    # times ceil(64 / 4) = 16 sequences = 18 GiB; 23.75 GiB in all.
    rollout = groups[0]
    assert rollout.memory["weights"] == pytest.approx(2 * P / GIB)
    assert rollout.memory["kv_cache"] == 18.0
    assert groups[2].memory == {}  # the reward pool holds no GPU


def test_a_group_over_the_cards_memory_is_named(a100, qwen):
    groups = plan_groups(a100, "pipeline", qwen, 32768)
    assert check_gpu_memory(groups, 80.0, 0.85) == []  # engines 23.75 <= 0.85 x 80 = 68; ranks 17.24 <= 80
    # An 18 GiB card: the engines' 23.75 GiB is over 0.85 x 18 = 15.3; the ranks' 17.24 fit 18.
    assert check_gpu_memory(groups, 18.0, 0.85) == [
        "rollout: each of an engine's GPUs needs ~23.7 GiB of GPU memory, which offers 15.3 (--gpu-memory-gib 18); "
        "change rollout.gpu_memory_utilization / rollout.tensor_parallel_size"]
    # A 12 GiB card: both (the learner is offered the whole card, 12.0 < 17.24).
    problems = check_gpu_memory(groups, 12.0, 0.85)
    assert [p.split(":")[0] for p in problems] == ["rollout", "learner"]
    assert "~17.2 GiB" in problems[1] and "offers 12.0" in problems[1] and "learner.zero_stage" in problems[1]


def test_tensor_parallel_engines_are_checked_per_gpu(a100, qwen):
    """With TP = 2 an engine's weights and KV cache are split over its 2 GPUs: its figures are per GPU, and each
    GPU is offered utilization x one card (not x 2)."""
    cfg = load_config(str(A100), ["rollout.tensor_parallel_size=2", "rollout.num_gpus_per_engine=2"])
    engines = plan_groups(cfg, "pipeline", qwen, 32768)[0]
    one_gpu = plan_groups(a100, "pipeline", qwen, 32768)[0]
    assert sum(engines.memory.values()) == pytest.approx(sum(one_gpu.memory.values()) / 2)
    need = sum(engines.memory.values())  # ~11.9 GiB a GPU
    assert check_gpu_memory((engines,), need / 0.85 * 1.01, 0.85) == []
    assert len(check_gpu_memory((engines,), need / 0.85 * 0.99, 0.85)) == 1


# ---------------------------------------------------------------------------------------------- placement arithmetic


def test_eight_gpus_fit_the_one_node_plan(a100, qwen):
    assert shortfalls(plan_groups(a100, "pipeline", qwen, 32768), {"CPU": 96.0, "GPU": 8.0}) == []


def test_four_gpus_leave_the_learner_four_short(a100, qwen):
    # The engines start first and take the 4 GPUs: the learner's 4 ranks find 0 left.
    problems = shortfalls(plan_groups(a100, "pipeline", qwen, 32768), {"CPU": 96.0, "GPU": 4.0})
    assert problems == ["learner: 4 x {CPU=8, GPU=1} do not fit: the cluster has GPU=4 in all, 0 left after "
                        "rollout; 4 GPU short (change learner.* or add nodes)"]


def test_a_custom_resource_the_cluster_lacks_is_named(qwen):
    cfg = load_config(A100, ["data.synthetic=true", "rollout.resources=rollout_node=0.01"])
    problems = shortfalls(plan_groups(cfg, "pipeline", qwen, 32768), {"CPU": 96.0, "GPU": 8.0})
    # 4 engines x 0.01 = 0.04 of a resource no node offers.
    assert problems == ["rollout: 4 x {CPU=8, GPU=1, rollout_node=0.01} do not fit: the cluster has rollout_node=0 "
                        "in all, 0 left; 0.04 rollout_node short (change rollout.* or add nodes)"]


def test_cpus_short_for_the_reward_pool(a100, qwen):
    # 70 CPUs: engines 32, ranks 32, 6 left for 8 reward workers x 1 CPU: 2 short.
    problems = shortfalls(plan_groups(a100, "pipeline", qwen, 32768), {"CPU": 70.0, "GPU": 8.0})
    assert problems == ["reward_pool: 8 x {CPU=1} do not fit: the cluster has CPU=70 in all, 6 left after rollout, "
                        "learner; 2 CPU short (change reward_pool.* or add nodes)"]


# ---------------------------------------------------------------------------------------------- sessions, plan_run


def test_check_sessions_names_the_malformed_line(tmp_path):
    path = tmp_path / "sessions.jsonl"
    write_sessions(synthesize_sessions(3, 0, 2, 0.1), path)
    with path.open("a") as f:
        f.write("{not json\n")  # line 4
    with pytest.raises(DataError, match=rf"^{path}:4: "):
        check_sessions(load_config(), str(path))
    # With data.skip_bad_lines the line is counted and the 3 sessions go on.
    sample, line = check_sessions(load_config(None, ["data.skip_bad_lines=true"]), str(path))
    assert len(sample) == 3
    assert line == f"sessions: {path}: 3 sessions parsed (1 bad lines skipped)"


def test_plan_run_without_a_sessions_source_names_the_key():
    cfg = load_config()  # data.sessions_path empty, data.synthetic false
    with pytest.raises(ConfigError, match=r"^data\.sessions_path is empty.*data\.synthetic=true"):
        plan_run(cfg, "pipeline", None, None)
    # sft and train read their examples files (checked by the command), not sessions.
    assert [g.name for g in plan_run(cfg, "sft", None, None).groups] == ["learner"]
