"""Token offsets from decoded prefixes, including byte-level tokens that split a character."""

from shop_r1.rollout.engine import token_offsets


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
