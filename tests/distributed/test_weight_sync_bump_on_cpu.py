"""After a skipped update the weights are unchanged: the sync only stamps the engines with the new version (no
bytes sent), and a real push still sends the weights. Local mode, fake engine and learner (no vLLM, no DeepSpeed)."""

from shop_r1.config import LearnerConfig, RolloutConfig
from shop_r1.distributed.engine_group import EngineGroup
from shop_r1.distributed.learner_group import LearnerGroup
from shop_r1.distributed.sync_group import make_weight_sync


class FakeEngine:
    def __init__(self, model_path, cfg, max_model_len, seed):
        self.version, self.loads = 0, 0

    def load_weights(self, named_tensors, version):
        list(named_tensors)
        self.loads += 1
        self.version = version

    def set_policy_version(self, version):
        self.version = version

    def policy_version(self):
        return self.version

    def shutdown(self):
        pass


class FakeLearner:
    def __init__(self, model_path, cfg, lr, total_steps, rank, world_size, seed, warmup_steps, reference_path,
                 lr_schedule="constant"):
        import torch

        self.weights = [("w", torch.ones(4))]

    def named_weights(self):
        return iter(self.weights)

    def shutdown(self):
        pass


def test_bump_moves_the_version_without_sending_weights():
    engines = EngineGroup("m", RolloutConfig(), 128, 0, local=True, engine_cls=FakeEngine)
    learners = LearnerGroup("m", LearnerConfig(), 1e-6, 1, 0, local=True, learner_cls=FakeLearner)
    sync = make_weight_sync(learners, engines, 1 << 20, local=True, backend="gloo")
    pushed = sync.push(1)
    assert pushed.num_bytes == 16 and engines.policy_versions() == [1]
    bumped = sync.bump(2)
    assert bumped.num_bytes == 0 and engines.policy_versions() == [2]
    assert engines.engines[0]._obj.loads == 1  # the bump loaded nothing
