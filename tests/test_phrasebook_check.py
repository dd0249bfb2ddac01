import pytest

from core.drafting import phrasebook
from drafter.evaluation.phrasebook_check import copy_acceptance, try_acceptance


def test_copies_are_scored_against_the_held_out_reply_slot_by_slot():
    """A book that knows "1 2 -> 3 4 5" (and so "2 3 -> 4 5", "3 4 -> 5"): in a reply that goes on "3 4 9" the copy
    after "1 2" keeps two tokens, the one after "2 3" one, the one after "3 4" none; a reply with no known n-gram gets
    no copy."""
    book = phrasebook.build([[1, 2, 3, 4, 5]] * 2, phrasebook.PhrasebookConfig(min_ngram=2, max_ngram=2, length=3))
    found = copy_acceptance(book, [([0, 1, 2, 3, 4, 9], 1), ([7, 7, 7], 1)])
    assert found["positions"] == 4 + 1
    assert found["hit"] == 3 / 5  # after "1 2", "2 3" and "3 4"
    first = found["by_match"][2]
    assert first["reached"][:3] == [3, 2, 1] and first["rate"][:3] == pytest.approx([2 / 3, 1 / 2, 0.0], abs=1e-4)
    assert found["kept_per_position"] == (2 + 1 + 0) / 5


def test_copy_tries_count_where_the_two_copies_differ_and_which_first_token_was_the_replys():
    """The book knows "1 2 -> 3"; the reply "1 2 7 1 2 3" holds, after its second "1 2", the conversation's copy 7
    (what followed "1 2" before) and the book's 3: they differ, and the book's is the reply's."""
    book = phrasebook.build([[1, 2, 3]] * 2, phrasebook.PhrasebookConfig(min_ngram=2, max_ngram=2, length=1))
    found = try_acceptance(book, [([0, 1, 2, 7, 1, 2, 3], 1)])
    assert found["positions"] == 5  # anchors at 1..5, each proposing the token after it
    assert found["differ"] == round(1 / 5, 4) and found["lookup_first"] == 0.0 and found["book_first"] == 1.0
    assert found["by_lookup_match"] == {2: {"share": round(1 / 5, 4), "lookup_first": 0.0, "book_first": 1.0}}
