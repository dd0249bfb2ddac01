import pytest

from lab.phrasebook_ab import summary


def test_each_book_over_plain_and_the_later_books_over_the_first_paired_by_prompt():
    rows = [{"plain": 100.0, "shipped": 110.0, "bigger": 121.0}, {"plain": 50.0, "shipped": 55.0, "bigger": 55.0}]
    out = summary(rows, "shipped", ["shipped", "bigger"])
    assert out["shipped / plain"]["mean"] == pytest.approx(1.1) and out["shipped / plain"]["se"] == pytest.approx(0)
    assert out["bigger / shipped"]["mean"] == pytest.approx(1.05) and "shipped / bigger" not in out
