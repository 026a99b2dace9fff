"""SFT batching: the loss mask covers exactly the assistant turns; truncation and packing keep their contracts."""

import json

from shop_r1.data.examples import build_sft_examples
from shop_r1.learner.sft_data import pack_micro_batches, sft_global_batches, tokenize_sft_example, tokenize_sft_examples
from shop_r1.types import Action, Session, Step


def _session(n=3, page="<html>results</html>") -> Session:
    acts = [Action("type_and_submit", "search_input", "red shoes"), Action("click", "buy_now"), Action("terminate")]
    return Session("s", tuple(Step(page, acts[i % 3], f"Reason {i}.") for i in range(n)))


def test_mask_covers_exactly_the_assistant_turns(tiny_tokenizer):
    (ex,) = build_sft_examples([_session()]).examples
    seq = tokenize_sft_example(ex, tiny_tokenizer, 10_000)
    masked = [t for t, m in zip(seq.input_ids, seq.loss_mask) if m]
    expected = "".join(m.content + "<|im_end|>" for m in ex.messages if m.role == "assistant")
    assert tiny_tokenizer.decode(masked) == expected
    assert json.loads(ex.messages[2].content)["rationale"] == "Reason 0."
    # the header "<|im_start|>assistant\n" is not a target
    assert tiny_tokenizer.convert_tokens_to_ids("<|im_start|>") not in masked


def test_truncation_omits_oldest_pages_then_drops_oldest_pairs_then_gives_up(tiny_tokenizer):
    (ex,) = build_sft_examples([_session(n=3, page="<html>" + "word " * 200 + "</html>")]).examples
    full = tokenize_sft_example(ex, tiny_tokenizer, 10_000)
    cut = tokenize_sft_example(ex, tiny_tokenizer, len(full.input_ids) - 1)
    assert (cut.num_omitted_pages, cut.num_dropped_turns) == (1, 0)
    kept = tiny_tokenizer.decode(cut.input_ids)
    assert "Reason 0." in kept and kept.count("word word") < full_count(tiny_tokenizer, full)  # targets all kept
    two_omitted = tokenize_sft_example(ex, tiny_tokenizer, len(cut.input_ids) - 1)
    assert two_omitted.num_omitted_pages == 2 and "Reason 0." in tiny_tokenizer.decode(two_omitted.input_ids)
    # Every page but the last omitted and still too long: the oldest pairs go.
    dropped = tokenize_sft_example(ex, tiny_tokenizer, len(two_omitted.input_ids) - 1)
    assert dropped.num_dropped_turns >= 1
    text = tiny_tokenizer.decode(dropped.input_ids)
    assert "Reason 0." not in text and "Reason 2." in text and text.startswith("<|im_start|>system")
    out = tokenize_sft_examples([ex], tiny_tokenizer, 50)
    assert out.sequences == () and out.num_dropped == 1


def full_count(tok, seq):
    return tok.decode(seq.input_ids).count("word word")


def test_packing_respects_the_token_budget(tiny_tokenizer):
    examples = build_sft_examples([_session(n=k) for k in (1, 2, 3, 3, 2)]).examples
    seqs = tokenize_sft_examples(examples, tiny_tokenizer, 10_000).sequences
    longest = max(len(s.input_ids) for s in seqs)
    budget = 2 * longest
    mbs = pack_micro_batches(seqs, budget, pad_id=tiny_tokenizer.pad_token_id)
    assert sum(mb.input_ids.shape[0] for mb in mbs) == len(seqs)
    for mb in mbs:
        assert mb.input_ids.numel() <= budget or mb.input_ids.shape[0] == 1
        assert int(mb.attention_mask.sum()) == sum(int(r.sum()) for r in mb.attention_mask)
        assert mb.num_loss_tokens == int(mb.loss_mask.sum()) and int(mb.loss_mask[:, 0].sum()) == 0
    # all assistant tokens survive packing (except a token at position 0, which is never a target)
    assert sum(mb.num_loss_tokens for mb in mbs) == sum(sum(s.loss_mask[1:]) for s in seqs)
    alone = pack_micro_batches(seqs, 1, pad_id=0)  # a budget below one sequence: one per micro-batch
    assert len(alone) == len(seqs)


def test_global_batches_cover_every_sequence_once_per_epoch(tiny_tokenizer):
    seqs = tokenize_sft_examples(build_sft_examples([_session(n=1 + i % 3) for i in range(7)]).examples,
                                 tiny_tokenizer, 10_000).sequences
    steps = sft_global_batches(seqs, global_batch_size=3, num_ranks=2, epoch=0, seed=0)
    assert [sum(len(share) for share in step) for step in steps] == [3, 3, 1]  # the last partial batch is kept
    assert all(len(step) == 2 for step in steps)
    flat = sorted(id(s) for step in steps for share in step for s in share)
    assert flat == sorted(id(s) for s in seqs)
    assert steps == sft_global_batches(seqs, 3, 2, epoch=0, seed=0)
    assert steps != sft_global_batches(seqs, 3, 2, epoch=1, seed=0)
