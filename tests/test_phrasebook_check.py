import pytest

from core.drafting import phrasebook
from drafter.evaluation.phrasebook_check import copy_acceptance


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
