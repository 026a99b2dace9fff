"""Every backend matches the protocol the drivers are written against: each protocol method exists on the backend
with the same parameter names (in order) and defaults, so a call written against the protocol works on it."""

import inspect

import pytest

from shop_r1.distributed.engine_group import EngineGroup
from shop_r1.distributed.learner_group import LearnerGroup
from shop_r1.distributed.protocols import Engines, Learners, WeightSync
from shop_r1.distributed.sync_group import BroadcastSync, DirectSync
from shop_r1.learner.backend import TrainingBackend
from shop_r1.learner.deepspeed_learner import DeepSpeedLearner
from shop_r1.learner.fsdp2_learner import FSDP2Learner
from shop_r1.learner.protocol import Learner
from shop_r1.rollout.engine import RolloutEngine
from shop_r1.rollout.vllm_engine import VLLMEngine


def _methods(protocol):
    return {name: fn for name, fn in vars(protocol).items() if inspect.isfunction(fn) and not name.startswith("_")}


def _params(fn):
    # Ray adds a keyword-only `_ray_trace_ctx` to the methods of a class it has made an actor (in place).
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values() if not p.name.startswith("_ray")]


@pytest.mark.parametrize("protocol, backend", [
    (Learner, DeepSpeedLearner), (TrainingBackend, DeepSpeedLearner), (Learner, FSDP2Learner),
    (TrainingBackend, FSDP2Learner), (RolloutEngine, VLLMEngine),
    (Learners, LearnerGroup), (Engines, EngineGroup), (WeightSync, BroadcastSync), (WeightSync, DirectSync)])
def test_backend_implements_its_protocol(protocol, backend):
    methods = _methods(protocol)
    assert methods, protocol
    for name, fn in methods.items():
        impl = getattr(backend, name, None)
        assert impl is not None, f"{backend.__name__} lacks {protocol.__name__}.{name}"
        assert _params(impl) == _params(fn), f"{backend.__name__}.{name}{inspect.signature(impl)} vs protocol {fn}"


def test_every_learner_backend_offers_the_deepspeed_learners_methods():
    """The learner group and the weight-sync transports also call methods outside the protocols (weight_manifest,
    broadcast_weights, nonfinite_weights, ...): every backend has each public method of DeepSpeedLearner, with the
    same parameters, and the same constructor (the group builds any backend with the same arguments)."""
    for name, fn in [("__init__", DeepSpeedLearner.__init__), *_methods(DeepSpeedLearner).items()]:
        impl = getattr(FSDP2Learner, name, None)
        assert impl is not None, f"FSDP2Learner lacks DeepSpeedLearner.{name}"
        assert _params(impl) == _params(fn), f"FSDP2Learner.{name}{inspect.signature(impl)} vs {fn}"


def test_the_check_can_fail():
    class Partial:
        def grpo_step(self, batch, rl_config):  # renamed parameter
            return None

    assert _params(Partial.grpo_step) != _params(Learner.grpo_step)
    assert getattr(Partial, "sft_step", None) is None
