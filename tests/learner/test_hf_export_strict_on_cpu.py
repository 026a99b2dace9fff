"""The HF export loads the learner's weights strictly: a key the model lacks or a model key the weights lack is an
error naming it, not a silently half-trained folder. The only keys allowed to be absent are a parameter tied to one
that is loaded (`lm_head.weight` under `tie_word_embeddings`) and buffers. No DeepSpeed: the loading is a plain
function, and `save_hf` runs on a stand-in for the learner."""

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from shop_r1.learner.backend import load_trained_weights
from shop_r1.learner.rank import LearnerRank


def _tiny(tied: bool, seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, max_position_embeddings=64,
                         tie_word_embeddings=tied)
    return Qwen2ForCausalLM(config).to(torch.float32).eval()


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What `LearnerRank.named_weights` yields: parameters only, a tied one once."""
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_a_matching_state_loads_every_weight_and_the_tied_head_follows():
    base, trained = _tiny(tied=True, seed=0), _tiny(tied=True, seed=1)
    state = _weights(trained)
    assert "lm_head.weight" not in state  # tied: named_parameters() yields only model.embed_tokens.weight
    load_trained_weights(base, state, source="test weights")
    for name, value in base.state_dict().items():
        assert torch.equal(value, trained.state_dict()[name]), name
    assert base.lm_head.weight is base.model.embed_tokens.weight


def test_an_extra_key_and_a_missing_key_are_named_and_nothing_is_loaded():
    base, trained = _tiny(tied=True, seed=0), _tiny(tied=True, seed=1)
    before = {name: value.clone() for name, value in base.state_dict().items()}
    state = _weights(trained)
    del state["model.layers.0.mlp.down_proj.weight"]
    state["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(3)
    with pytest.raises(ValueError) as error:
        load_trained_weights(base, state, source="test weights")
    message = str(error.value)
    assert "test weights do not match the Qwen2ForCausalLM" in message
    assert "1 missing (model.layers.0.mlp.down_proj.weight)" in message
    assert "1 unexpected (model.layers.0.mlp.extra_proj.weight)" in message
    assert all(torch.equal(value, before[name]) for name, value in base.state_dict().items())


def test_an_untied_head_must_be_in_the_state():
    base, trained = _tiny(tied=False, seed=0), _tiny(tied=False, seed=1)
    state = _weights(trained)
    assert "lm_head.weight" in state
    load_trained_weights(base, state, source="test weights")
    assert torch.equal(base.lm_head.weight, trained.lm_head.weight)
    del state["lm_head.weight"]  # no tied partner here: the base model's head would be exported untrained
    with pytest.raises(ValueError, match=r"1 missing \(lm_head.weight\); 0 unexpected \(none\)"):
        load_trained_weights(base, state, source="test weights")


def test_a_long_list_is_cut_with_a_count():
    base = _tiny(tied=True, seed=0)
    with pytest.raises(ValueError, match=r"missing \(.+ and \d+ more\); 0 unexpected"):
        load_trained_weights(base, {}, source="an empty state")


def test_a_shape_mismatch_is_an_error():
    base, state = _tiny(tied=True, seed=0), _weights(_tiny(tied=True, seed=1))
    state["model.norm.weight"] = torch.ones(7)
    with pytest.raises(RuntimeError, match="size mismatch for model.norm.weight"):
        load_trained_weights(base, state, source="test weights")


def test_save_hf_writes_the_trained_weights_or_no_folder(tiny_model_dir, tmp_path):
    trained = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01)
    state = _weights(trained)
    learner = SimpleNamespace(rank=0, step=3, model_path=str(tiny_model_dir), named_weights=lambda: iter(state.items()))
    LearnerRank.save_hf(learner, str(tmp_path / "hf"))
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    for name, value in exported.state_dict().items():
        assert torch.equal(value, trained.state_dict()[name]), name

    state.pop("model.norm.weight")
    with pytest.raises(ValueError, match=r"the learner's weights at step 3 do not match.*model\.norm\.weight"):
        LearnerRank.save_hf(learner, str(tmp_path / "broken"))
    assert not (tmp_path / "broken").exists()
