"""Token offsets from decoded prefixes, including byte-level tokens that split a character."""

from shop_r1.rollout.engine import stream_offsets, token_offsets


def test_offsets_from_prefixes():
    # tokens: '{"r', '": "', 'hi', '"}'
    text = '{"r": "hi"}'
    prefixes = ["", '{"r', '{"r": "', '{"r": "hi']
    assert token_offsets(prefixes, text) == (0, 3, 7, 9)


def test_partial_character_goes_to_the_token_that_completes_it():
    # 'é' is two bytes split over tokens 1 and 2: the prefix after token 1 ends in U+FFFD.
    text = "café!"
    prefixes = ["", "caf", "caf\ufffd", "café"]
    assert token_offsets(prefixes, text) == (0, 3, 3, 4)


def test_offsets_are_clamped_and_monotonic():
    assert token_offsets(["", "abc", "ab"], "ab") == (0, 2, 2)


def test_stream_offsets_match_prefix_decoding_on_a_real_tokenizer(tiny_tokenizer):
    """The O(T) incremental path (DecodeStream, used by the engine) gives the offsets of the O(T^2) prefix path,
    on text with multi-byte characters split over byte-level tokens."""
    import random

    from tokenizers.decoders import DecodeStream


    rng = random.Random(0)
    alphabet = list('abc {}":,é日本€🛒') + ["rationale", "click", " the "]
    for _ in range(50):
        ids = tiny_tokenizer("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))),
                             add_special_tokens=False).input_ids
        text = tiny_tokenizer.decode(ids, skip_special_tokens=True)
        prefixes = [tiny_tokenizer.decode(ids[:j], skip_special_tokens=True) for j in range(len(ids))]
        stream = DecodeStream(skip_special_tokens=True)
        pieces = [stream.step(tiny_tokenizer.backend_tokenizer, t) for t in ids]
        assert "".join(p or "" for p in pieces) == text
        assert stream_offsets(pieces, text) == token_offsets(prefixes, text)


def test_stream_offsets_hand_computed():
    # 'é' split over tokens 3 and 4 (None while incomplete): both start at 3, token 4 spans it.
    assert stream_offsets(["c", "a", "f", None, "é", "!"], "café!") == (0, 1, 2, 3, 3, 4)
    assert stream_offsets(["abc", "d"], "ab") == (0, 2)  # clamped to the engine's text
