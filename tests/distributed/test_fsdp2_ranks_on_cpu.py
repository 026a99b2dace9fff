"""Two FSDP2 ranks on Ray (gloo) skip a non-finite update together: AdamW steps each rank's own shards with no
collective, so a rank that stepped alone would leave the ranks holding pieces of two different models."""

import math
import sys

import pytest

from shop_r1.config import LearnerConfig, RLConfig
from shop_r1.learner.rank import LearnerRank
from tests.algo.test_shared_prompt_on_cpu import _grouped_batch


class NaNOnRankOne(LearnerRank):
    """Rank 1's LM head puts out NaN in its first GRPO update (rank 0's losses stay finite)."""

    def grpo_step(self, batch, loss_cfg):
        if self.rank != 1 or self.step > 0:
            return super().grpo_step(batch, loss_cfg)

        def poison(module, args, out):
            return out * math.nan

        handle = self.backend.module.lm_head.register_forward_hook(poison)
        try:
            return super().grpo_step(batch, loss_cfg)
        finally:
            handle.remove()


@pytest.mark.timeout(900)
def test_a_nonfinite_loss_on_one_rank_skips_the_update_on_both(ray_local_cluster, tiny_model_dir):
    import ray.cloudpickle

    from shop_r1.distributed.learner_group import LearnerGroup

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    batch, loss_cfg = _grouped_batch(1), RLConfig(kl_beta=0.1).loss_config(max_new_tokens=16)
    group = LearnerGroup(str(tiny_model_dir), LearnerConfig(backend="fsdp2", num_ranks=2, num_cpus_per_rank=0.5), 1e-2,
                         3, 0, local=False, reference_path=str(tiny_model_dir), learner_cls=NaNOnRankOne)
    try:
        before = group.probe_logprobs(batch)  # gathered from both ranks' shards
        assert [s.nonfinite for s in group.grpo_step(batch, loss_cfg)] == ["loss", "loss"]
        assert group.probe_logprobs(batch) == before
        assert [s.nonfinite for s in group.grpo_step(batch, loss_cfg)] == ["", ""]
        assert group.probe_logprobs(batch) != before
    finally:
        group.shutdown()
