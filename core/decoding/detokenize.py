"""A reply's text as its tokens arrive, without decoding the whole reply every round.

Why: the engine reports the whole text so far after every round, and decoding all of a reply's tokens each time costs
in proportion to its length (docs/journal/engine.md, "Measurements behind the code's rules"). Here each round decodes
only a window of recent tokens.

How (the offsets vLLM's incremental detokenizer keeps): the text before `read_at` is settled. A round decodes the
tokens from `prefix_at` (the start of the previous window) to the end and keeps what follows the same window's text up
to `read_at`: decoding from a few tokens back lets a tokenizer treat the boundary as it would inside the whole reply
(a SentencePiece tokenizer drops the leading space of a text's first token; a byte-level one splits a character over
tokens). Where that window's text is not a prefix of the longer decode, the round's text comes from a whole decode;
while a character is still incomplete (U+FFFD at the end), nothing is settled. Either way the text equals decoding all
the tokens (tests/test_detokenize.py).
"""
from __future__ import annotations

from typing import Callable

INCOMPLETE = "\ufffd"  # what a decode shows for bytes of a character whose other bytes have not arrived


class IncrementalText:
    """The text of a growing list of token ids; `decode` maps ids to text (the target's tokenizer)."""

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode = decode
        self.ids: list[int] = []
        self.settled = ""  # the text of ids[:read_at]
        self.prefix_at = 0  # the window's first token
        self.read_at = 0  # the first token whose text is not settled
        self.window_text = ""  # decode(ids[prefix_at:read_at])

    def extend(self, ids: list[int]) -> str:
        """Append ids; return the whole text so far (what decoding all of self.ids gives)."""
        self.ids.extend(ids)
        recent = self.decode(self.ids[self.prefix_at:])
        if recent.startswith(self.window_text):
            text = self.settled + recent[len(self.window_text):]
        else:  # the window's boundary decodes differently inside the longer text: decode it all this once
            text = self.decode(self.ids)
        if ids and not text.endswith(INCOMPLETE):
            self._settle(text)
        return text

    def _settle(self, text: str) -> None:
        """All the tokens so far decode to `text`; the next window starts at the tokens settled last time (never empty:
        a window's first token gives the next ones the context they have in the whole text)."""
        self.settled, self.prefix_at, self.read_at = text, self.read_at, len(self.ids)
        self.window_text = self.decode(self.ids[self.prefix_at:self.read_at])
