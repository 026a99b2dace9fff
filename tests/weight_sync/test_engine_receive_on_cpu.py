"""The vLLM engine's end of the wire on CPU: two syncs of different weights through the real WeightReceiver into
the in-process engine, loaded in place (rollout.weight_load=in_place: the learner's fused layout, one pass) and through
vLLM's layerwise reload; the engine's parameters equal what was sent each time, and its phase times are recorded. A
layout the in-place path cannot take (q/k/v parts not adjacent) falls back under `auto` and is refused under
`in_place`."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

from shop_r1.config import RolloutConfig
from shop_r1.weight_sync.broadcast import SyncGroupSpec, WeightSender, make_manifest, open_master_store
from tests.weight_sync.test_buffers_and_phases_on_cpu import _assert_pool_reused, _settled

FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _engine_state(worker) -> dict[str, torch.Tensor]:
    """The engine's parameters; a linear layer (repacked for the CPU kernels) as the weight it applies: its output
    on the identity, transposed, less its bias."""
    from vllm.model_executor.layers.linear import LinearBase

    model = worker.model_runner.get_model()
    state = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, LinearBase):
                out = module(torch.eye(module.input_size))[0]
                bias = getattr(module, "bias", None)
                state[f"{name}.weight"] = (out - (bias if bias is not None else 0)).T.contiguous()
    return state


def _sources(name: str) -> list[str]:
    """The HF tensors vLLM's parameter `name` holds: itself, or those it fuses (concatenated by rows)."""
    for fused, parts in FUSED.items():
        if f".{fused}." in name:
            return [name.replace(fused, part) for part in parts]
    return [name]


def _connect(engine):
    store = open_master_store("127.0.0.1", timeout_s=120)
    spec = SyncGroupSpec("127.0.0.1", store.port, world_size=2, timeout_s=120)
    made: dict = {}
    joining = threading.Thread(target=lambda: made.update(sender=WeightSender(spec, torch.device("cpu"), store)))
    joining.start()
    engine.init_weight_receiver(spec, 1)
    joining.join(timeout=120)
    return made["sender"]


def _sync(engine, sender, manifest, sent: dict[str, torch.Tensor], version: int):
    """One broadcast of `sent` in the manifest's order; returns the engine's ReceiveStats and the bytes sent."""
    out: dict = {}
    ordered = [(m.name, sent[m.name]) for bucket in manifest.buckets for m in bucket]
    sending = threading.Thread(target=lambda: out.update(bytes=sender.send(manifest, iter(ordered))))
    sending.start()
    try:
        return engine.receive_weights(manifest, version), out
    finally:
        sending.join(timeout=120)


def _assert_engine_holds(engine, want: dict[str, torch.Tensor]) -> None:
    compared = set()
    for name, have in engine.llm.collective_rpc(_engine_state)[0].items():
        sources = _sources(name)
        if all(s in want for s in sources):  # vLLM's tied lm_head is the embedding, sent once
            expected = torch.cat([want[s] for s in sources])
            # vLLM pads the vocabulary to a multiple of 64 rows: the sent rows lead.
            torch.testing.assert_close(have[:len(expected)], expected, rtol=1e-5, atol=1e-5, msg=name)
            compared.update(sources)
    assert compared == set(want)


def _assert_engine_computes(engine, model_dir, weights: dict[str, torch.Tensor]) -> None:
    """The engine's greedy logprobs equal a float32 transformers forward with `weights` (the lm_head included)."""
    from transformers import AutoModelForCausalLM

    from shop_r1.types import SamplingSpec

    prompt = [5, 17, 42, 9, 33, 7, 21, 64]
    [gen] = engine.generate([prompt], SamplingSpec(n=1, temperature=0.0, max_new_tokens=6, top_k_logprobs=0))
    completion = gen.completions[0]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.load_state_dict(weights, strict=False)
    ids = torch.tensor([prompt + list(completion.token_ids)])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    want = [float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(completion.token_ids)]
    assert completion.logprobs == pytest.approx(want, abs=1e-4)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("weight_load, zero_copy, cpu_linear", [
    ("in_place", False, "onednn"), ("layerwise", False, "onednn"), ("in_place", True, "onednn"),
    ("in_place", False, "torch")])
def test_two_syncs_of_different_weights_land_in_the_engine(tiny_model_dir, weight_load, zero_copy, cpu_linear):
    """rollout.cpu_linear=torch: the linear layers keep plain weights (an update is a copy, no repack), and the
    engine computes the sent weights' logprobs after each sync, the tied lm_head included."""
    from transformers import AutoModelForCausalLM

    from shop_r1.rollout.cpu_linear import is_plain
    from shop_r1.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(str(tiny_model_dir), RolloutConfig(num_engines=1, kv_cache_gib=1.0, weight_load=weight_load,
                                                           cpu_linear=cpu_linear), 256, seed=0)
    num_plain = engine.llm.collective_rpc("shop_r1_plain_linear_layers")[0]
    assert (num_plain > 0) == (cpu_linear == "torch")
    if cpu_linear == "torch":  # every linear layer and the lm_head
        from vllm.model_executor.layers.linear import LinearBase

        kinds = engine.llm.collective_rpc(lambda w: sorted({type(m).__name__ for m in w.model_runner.get_model()
                                                           .modules() if is_plain(m)}))[0]
        linear = engine.llm.collective_rpc(lambda w: sum(isinstance(m, LinearBase)
                                                         for m in w.model_runner.get_model().modules()))[0]
        # ... the embedding (whose GEMM dispatch vLLM runs too) and the lm_head, tied to it here
        assert num_plain == linear + 2 and {"ParallelLMHead", "VocabParallelEmbedding"} <= set(kinds), kinds
    base = [(n, p.detach().clone()) for n, p in
            AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).named_parameters()]
    # The learners' layout: q/k/v and gate/up parts adjacent, never split across buckets.
    manifest = make_manifest(((n, tuple(t.shape), t.dtype) for n, t in base), bucket_bytes=64 << 10, fuse=True)
    manifest = dataclasses.replace(manifest, zero_copy=zero_copy)  # weight_sync.zero_copy: a broadcast per tensor
    assert len(manifest.buckets) > 3
    sender = _connect(engine)
    # When the CPU lm_head (tied to the embedding) is repacked: how many tensors the stream had handed out by then.
    handed, repacks = [0], []
    receive = engine._receiver.receive

    def counting(manifest):
        for item in receive(manifest):
            handed[0] += 1
            yield item

    engine._receiver.receive = counting
    lm_head = engine.llm.collective_rpc(lambda w: w.model_runner.get_model().lm_head)[0]  # in-process engine
    method = lm_head.quant_method
    repack = method.process_weights_after_loading
    method.process_weights_after_loading = lambda layer: (repacks.append(handed[0]), repack(layer))[1]
    tensors = sum(len(b) for b in manifest.buckets)

    ptrs = None
    for version, scale in ((1, 1.5), (2, -0.5)):
        sent = {n: t * scale + 0.01 * version for n, t in base}
        handed[0], repacks[:] = 0, []
        stats, out = _sync(engine, sender, manifest, sent, version)
        assert out["bytes"] == manifest.num_bytes and engine.policy_version() == version
        assert min(stats.transfer_s, stats.load_s, stats.post_s, stats.reset_s) >= 0 and stats.load_s > 0
        assert stats.path == weight_load if weight_load == "in_place" else stats.path.startswith("layerwise")
        _assert_engine_holds(engine, sent)
        _assert_engine_computes(engine, tiny_model_dir, sent)  # the lm_head's logits from the new embedding
        assert handed[0] == tensors
        if cpu_linear == "torch":
            assert repacks == []  # a plain lm_head computes from the parameter
        elif weight_load == "in_place":
            # once, as soon as the embedding (the stream's first tensor) is in, while the rest is still to come
            assert repacks == [1]
        else:
            assert repacks[-1] == tensors  # vLLM's layerwise reload: after the stream

        now = [t.data_ptr() for pool in engine._receiver.pools.values() for t in pool]
        if ptrs is not None:
            _assert_pool_reused(ptrs, now, manifest)  # the second sync reused the receive buffers
        ptrs = now
        _settled(engine._receiver)
        assert bool(sender.buffers) != zero_copy  # persistent send buffers, unless sent from the tensors themselves

    if weight_load == "in_place" and not zero_copy and cpu_linear == "onednn":
        # Qwen2's parameter order interleaves q/k/v weights and biases: not the fused layout.
        plain = make_manifest(((n, tuple(t.shape), t.dtype) for n, t in base), bucket_bytes=64 << 10)
        sent = {n: t * 0.5 for n, t in base}
        engine.cfg.weight_load = "auto"
        stats, _ = _sync(engine, sender, plain, sent, 3)
        assert stats.path.startswith("layerwise (") and "q_proj" in stats.path
        _assert_engine_holds(engine, sent)
        engine.cfg.weight_load = "in_place"
        with pytest.raises(Exception, match="cannot load in place"):
            _sync(engine, sender, plain, {n: t * 0.25 for n, t in base}, 4)

    if cpu_linear == "torch":
        # A layerwise reload keeps the plain layers plain (vLLM processes every layer again after it) ...
        engine.cfg.weight_load = "layerwise"
        sent = {n: t * 0.75 for n, t in base}
        stats, _ = _sync(engine, sender, manifest, sent, 3)
        assert stats.path.startswith("layerwise")
        assert engine.llm.collective_rpc("shop_r1_plain_linear_layers")[0] == num_plain
        _assert_engine_computes(engine, tiny_model_dir, sent)
        # ... and an engine built after it in the same process with the default is vLLM's own again.
        engine.shutdown()
        other = VLLMEngine(str(tiny_model_dir), RolloutConfig(num_engines=1, kv_cache_gib=1.0), 256, seed=0)
        assert other.llm.collective_rpc("shop_r1_plain_linear_layers")[0] == 0
        other.shutdown()
