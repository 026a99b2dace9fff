"""Every backend matches the protocol the drivers are written against: each protocol method exists on the backend
with the same parameter names (in order) and defaults, so a call written against the protocol works on it."""

import inspect
import math
import os

import pytest
import torch

from shop_r1.distributed.engine_group import EngineGroup
from shop_r1.distributed.learner_group import LearnerGroup
from shop_r1.distributed.protocols import Engines, Learners, LearnerWeights, WeightSync
from shop_r1.distributed.sync_group import BroadcastSync, DirectSync
from shop_r1.learner.backend import TrainingBackend
from shop_r1.learner.deepspeed_learner import DeepSpeedBackend
from shop_r1.learner.fsdp2_learner import FSDP2Backend
from shop_r1.learner.protocol import Learner, TrainingRank, WeightSource
from shop_r1.learner.rank import LearnerRank
from shop_r1.rollout.engine import RolloutEngine
from shop_r1.rollout.vllm_engine import VLLMEngine


def _methods(protocol):
    return {name: fn for name, fn in vars(protocol).items() if inspect.isfunction(fn) and not name.startswith("_")}


def _params(fn):
    # Ray adds a keyword-only `_ray_trace_ctx` to the methods of a class it has made an actor (in place).
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values() if not p.name.startswith("_ray")]


@pytest.mark.parametrize("protocol, backend", [
    (Learner, LearnerRank), (WeightSource, LearnerRank), (TrainingRank, LearnerRank),
    (TrainingBackend, DeepSpeedBackend), (TrainingBackend, FSDP2Backend), (RolloutEngine, VLLMEngine),
    (Learners, LearnerGroup), (LearnerWeights, LearnerGroup), (Engines, EngineGroup), (WeightSync, BroadcastSync),
    (WeightSync, DirectSync)])
def test_backend_implements_its_protocol(protocol, backend):
    methods = _methods(protocol)
    assert methods, protocol
    for name, fn in methods.items():
        impl = getattr(backend, name, None)
        assert impl is not None, f"{backend.__name__} lacks {protocol.__name__}.{name}"
        assert _params(impl) == _params(fn), f"{backend.__name__}.{name}{inspect.signature(impl)} vs protocol {fn}"


def _public(cls):
    return {name for name, value in vars(cls).items()
            if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property))}


@pytest.mark.parametrize("backend", [DeepSpeedBackend, FSDP2Backend])
def test_a_backend_holds_only_the_training_backend_protocol(backend):
    """What every backend shares lives in the learner rank: a backend's public methods are TrainingBackend's and
    nothing more, and it is built from the one setup record (the rank builds any backend the same way)."""
    assert _public(backend) == _public(TrainingBackend), backend.__name__
    assert _params(backend.__init__) == [("self", inspect.Parameter.empty), ("setup", inspect.Parameter.empty)]


def test_the_weight_sync_reaches_the_learners_only_through_learner_weights():
    """No transport reaches past the learner group to its ranks (`learners.ranks`)."""
    source = inspect.getsource(inspect.getmodule(BroadcastSync))
    assert ".ranks" not in source


def test_the_check_can_fail():
    class Partial:
        def grpo_step(self, batch, rl_config):  # renamed parameter
            return None

    assert _params(Partial.grpo_step) != _params(Learner.grpo_step)
    assert getattr(Partial, "sft_step", None) is None


class PlainBackend:
    """A third backend, implementing TrainingBackend only: plain torch on one rank (no process group, no sharding),
    AdamW clipped to learner.grad_clip, its checkpoint one torch.save file."""

    def __init__(self, setup):
        from shop_r1.learner.backend import adamw, load_policy

        self.cfg = setup.cfg
        self.module = load_policy(setup)
        self.optimizer, self.scheduler = adamw(self.module.parameters(), setup)

    @property
    def policy(self):
        return self.module

    @property
    def device(self):
        return torch.device("cpu")

    def begin_micro_batch(self):
        pass

    def backward(self, loss):
        loss.backward()

    def grad_norm(self):
        params = [p for p in self.module.parameters() if p.grad is not None]
        return float(torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip)) if params else None

    def apply_step(self):
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return None

    def drop_gradients(self):
        self.optimizer.zero_grad(set_to_none=True)

    def release_gathered(self):
        pass

    def weight_shapes(self):
        return ((name, tuple(p.shape)) for name, p in self.module.named_parameters())

    def gathered_buckets(self, buckets):
        params = dict(self.module.named_parameters())
        for names in buckets:
            yield [(name, params[name]) for name in names]

    def named_weights(self):
        for name, p in self.module.named_parameters():
            yield name, p.detach().to(torch.float32).clone()

    def save_checkpoint(self, ckpt_dir, tag, client_state):
        os.makedirs(ckpt_dir, exist_ok=True)
        torch.save({"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict(), "client_state": client_state},
                   os.path.join(ckpt_dir, "plain.pt"))

    def load_checkpoint(self, ckpt_dir):
        path = os.path.join(ckpt_dir, "plain.pt")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{ckpt_dir}: no plain checkpoint to resume from")
        state = torch.load(path, weights_only=False)
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        return state["client_state"]


def test_a_third_backend_plugs_into_the_learner_rank(tmp_path):
    """The seam's test: a backend that implements only TrainingBackend (no step, guard, reference, checkpoint step
    or weight-source code of its own) trains a GRPO step through the shared learner rank, which counts the step,
    guards a non-finite loss, hands on the weights and resumes from the backend's checkpoint. A model of a few
    thousand weights, built here: no framework, no model fixture."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from shop_r1.config import LearnerConfig, RLConfig
    from tests.algo.test_shared_prompt_on_cpu import _grouped_batch

    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(vocab_size=256, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                 tie_word_embeddings=True)).save_pretrained(tmp_path / "model")
    path = str(tmp_path / "model")

    def make():
        return LearnerRank(path, LearnerConfig(max_tokens_per_micro_batch=24), lr=1e-2, total_steps=2,
                           reference_path=path, backend=PlainBackend)

    learner = make()
    assert isinstance(learner.backend, TrainingBackend) and isinstance(learner, WeightSource)
    before = dict(learner.named_weights())
    stats = learner.grpo_step(_grouped_batch(1), RLConfig(kl_beta=0.1).loss_config(max_new_tokens=16))
    after = dict(learner.named_weights())
    assert learner.step == stats.step == 1 and stats.num_tokens == 22 and not stats.nonfinite
    assert math.isfinite(stats.grad_norm) and max(float((after[n] - before[n]).abs().max()) for n in before) > 1e-3
    assert learner.optimizer_step([math.nan]).nonfinite == "loss"  # the shared guard: no step
    assert all(torch.equal(t, after[n]) for n, t in learner.named_weights())
    manifest = learner.weight_manifest(bucket_bytes=1 << 20)
    assert sorted(m.name for b in manifest.buckets for m in b) == sorted(after)
    assert learner.nonfinite_weights() == []

    learner.save_checkpoint(str(tmp_path / "ckpt"), {"cursor": 3})
    fresh = make()
    assert fresh.load_checkpoint(str(tmp_path / "ckpt")) == {"cursor": 3, "learner_step": 1} and fresh.step == 1
    assert all(torch.equal(t, after[n]) for n, t in fresh.named_weights())
