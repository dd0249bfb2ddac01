import random

import pytest

from core.decoding.detokenize import IncrementalText


def byte_level(ids: list[int]) -> str:
    """A byte-level tokenizer's decode: each id is one byte, a character split over ids shows U+FFFD until whole."""
    return bytes(ids).decode("utf-8", errors="replace")


def sentencepiece_like(ids: list[int]) -> str:
    """Pieces that carry their leading space, which a decode drops at the start of its text (SentencePiece)."""
    pieces = [" alpha", " beta", "gam", "ma", ".", " delta"]
    return "".join(pieces[i] for i in ids).removeprefix(" ")


def cleaning(ids: list[int]) -> str:
    """A decode that cleans " ." into "." across pieces, so a boundary can decode differently in a longer text."""
    pieces = ["a", " ", ".", "b", " ."]
    return "".join(pieces[i] for i in ids).replace(" .", ".")


class Counting:
    def __init__(self, decode):
        self.decode, self.lengths = decode, []

    def __call__(self, ids):
        self.lengths.append(len(ids))
        return self.decode(ids)


def feed(decode, ids: list[int], seed: int) -> None:
    """Feed ids in random chunks of 0-4; after every chunk the text equals decoding everything so far."""
    text, rng, at = IncrementalText(decode), random.Random(seed), 0
    while at < len(ids):
        step = rng.randint(0, 4)
        assert text.extend(ids[at:at + step]) == decode(ids[:at + step])
        at += step


@pytest.mark.parametrize("seed", range(5))
def test_characters_split_over_tokens_come_out_whole(seed):
    ids = list("naïve café — 数学 🙂 ok".encode())
    feed(byte_level, ids, seed)


@pytest.mark.parametrize("seed", range(5))
def test_a_window_keeps_the_leading_space_a_whole_decode_keeps(seed):
    ids = random.Random(seed).choices(range(6), k=60)
    feed(sentencepiece_like, ids, seed)


@pytest.mark.parametrize("seed", range(5))
def test_a_boundary_that_decodes_differently_falls_back_to_a_whole_decode(seed):
    ids = random.Random(seed).choices(range(5), k=60)
    feed(cleaning, ids, seed)


def test_each_round_decodes_a_short_window_not_the_whole_reply():
    counting = Counting(byte_level)
    text = IncrementalText(counting)
    ids = list(("word " * 200).encode())
    for at in range(0, len(ids), 2):
        text.extend(ids[at:at + 2])
    assert text.settled == byte_level(ids)
    assert max(counting.lengths) <= 4


@pytest.mark.slow
def test_the_embedded_tokenizer_decodes_incrementally_as_a_whole(embedded_target):
    reply = "Here are 3 tips:\n1. Sleep 8 hours 😴.\n2. Eat fruit (pommes, 苹果).\n3. Walk — daily!"
    ids = embedded_target.tokenizer(reply, add_special_tokens=False)["input_ids"]
    for seed in range(3):
        feed(embedded_target.decode, ids, seed)
