"""The learner's pre-fused layout (make_manifest(..., fuse=True)): what vLLM fuses arrives adjacent, in its fused
order, inside one bucket, so the engine can take the parts as one tensor (shop_r1/rollout/in_place_load.py)."""

from __future__ import annotations

import torch

from shop_r1.weight_sync.broadcast import first_bucket_bytes, fused_target, fusion_order, make_manifest

QWEN2_LAYER = ["model.embed_tokens.weight",
               "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.bias",
               "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.k_proj.bias",
               "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.v_proj.bias",
               "model.layers.0.self_attn.o_proj.weight",
               "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
               "model.layers.0.mlp.down_proj.weight", "model.norm.weight"]


def test_fused_target_names_the_fused_parameter_and_the_part():
    assert fused_target("model.layers.3.self_attn.k_proj.weight") == ("model.layers.3.self_attn.qkv_proj.weight", 1)
    assert fused_target("model.layers.3.self_attn.v_proj.bias") == ("model.layers.3.self_attn.qkv_proj.bias", 2)
    assert fused_target("model.layers.3.mlp.up_proj.weight") == ("model.layers.3.mlp.gate_up_proj.weight", 1)
    assert fused_target("model.layers.3.self_attn.o_proj.weight") is None
    assert fused_target("model.norm.weight") is None


def test_fusion_order_puts_the_parts_together_in_fused_order():
    assert fusion_order(QWEN2_LAYER) == [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.k_proj.bias",
        "model.layers.0.self_attn.v_proj.bias",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.down_proj.weight", "model.norm.weight"]
    # parts listed out of order come back in vLLM's order (q, k, v; gate, up)
    assert fusion_order(["a.mlp.up_proj.weight", "a.mlp.gate_proj.weight"]) == ["a.mlp.gate_proj.weight",
                                                                               "a.mlp.up_proj.weight"]


def test_a_fused_group_never_straddles_two_buckets():
    # norm 10 elements, q, k, v weights 40, 20, 20, o 10 (float32: 40, 160, 80, 80, 40 bytes); buckets of 200 bytes.
    named = [("x.norm.weight", (10,), torch.float32),
             ("x.q_proj.weight", (4, 10), torch.float32), ("x.k_proj.weight", (2, 10), torch.float32),
             ("x.v_proj.weight", (2, 10), torch.float32), ("x.o_proj.weight", (10,), torch.float32)]
    plain = make_manifest(named, bucket_bytes=200)
    # norm + q fill the first bucket (200 bytes); k, v and o the second: q is split from k and v
    assert [[m.name for m in b] for b in plain.buckets] == [
        ["x.norm.weight", "x.q_proj.weight"], ["x.k_proj.weight", "x.v_proj.weight", "x.o_proj.weight"]]
    fused = make_manifest(named, bucket_bytes=200, fuse=True)
    # the 320-byte group goes alone, whole, into a bucket of its own
    assert [[m.name for m in b] for b in fused.buckets] == [
        ["x.norm.weight"], ["x.q_proj.weight", "x.k_proj.weight", "x.v_proj.weight"], ["x.o_proj.weight"]]
    assert fused.num_bytes == plain.num_bytes
    # and a small group shares a bucket with what follows
    small = make_manifest(named, bucket_bytes=1000, fuse=True)
    assert len(small.buckets) == 1 and [m.name for m in small.buckets[0]] == [
        "x.norm.weight", "x.q_proj.weight", "x.k_proj.weight", "x.v_proj.weight", "x.o_proj.weight"]


def test_the_first_bucket_is_small_so_the_engine_starts_loading_early():
    # the same tensors (40, 160, 80, 80, 40 bytes); buckets of 400 bytes, the first of at most 50
    named = [("x.norm.weight", (10,), torch.float32),
             ("x.q_proj.weight", (4, 10), torch.float32), ("x.k_proj.weight", (2, 10), torch.float32),
             ("x.v_proj.weight", (2, 10), torch.float32), ("x.o_proj.weight", (10,), torch.float32)]
    assert first_bucket_bytes(400) == 50 and first_bucket_bytes(256 << 20) == 32 << 20 and first_bucket_bytes(3) == 1
    first = make_manifest(named, bucket_bytes=400, fuse=True, first_bytes=first_bucket_bytes(400))
    # the norm alone (40 bytes; the q/k/v group would make 360 > 50), then the rest up to 400 bytes a bucket
    assert [[m.name for m in b] for b in first.buckets] == [
        ["x.norm.weight"], ["x.q_proj.weight", "x.k_proj.weight", "x.v_proj.weight", "x.o_proj.weight"]]
    # a first tensor bigger than the first bucket's bound goes alone; the order and the bytes are unchanged
    tight = make_manifest(named, bucket_bytes=400, fuse=True, first_bytes=8)
    assert [[m.name for m in b] for b in tight.buckets] == [[m.name for m in b] for b in first.buckets]
    same = make_manifest(named, bucket_bytes=400, fuse=True)  # without: all 400 bytes in one bucket
    assert [[m.name for m in b] for b in same.buckets] == [
        ["x.norm.weight", "x.q_proj.weight", "x.k_proj.weight", "x.v_proj.weight", "x.o_proj.weight"]]
    assert first.num_bytes == tight.num_bytes == same.num_bytes == 400
