import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from core.drafting import phrasebook
from core.drafting.phrasebook import Phrasebook, PhrasebookConfig, PhrasebookError, majority_continuation, ngram_key

TARGET = {"name": "tiny", "model_type": "llama", "vocab_size": 70000, "hidden_size": 8, "num_hidden_layers": 2}


def test_the_majority_continuation_follows_what_most_occurrences_agree_on():
    followers = [[5, 6, 7], [5, 6, 8], [5, 6, 8], [9, 1, 1]]
    assert majority_continuation(followers, length=3, min_support=2) == [5, 6, 8]
    assert majority_continuation(followers, length=2, min_support=2) == [5, 6]  # the length caps it
    assert majority_continuation(followers, length=3, min_support=3) == [5, 6]  # only two agree on 8
    assert majority_continuation(followers, length=3, min_support=4) == []  # not even the first token


def test_ngram_keys_tell_order_and_length_apart():
    keys = {ngram_key(ids) for ids in ([1, 2], [2, 1], [1, 2, 3], [0, 1, 2], [0, 0], [0])}
    assert len(keys) == 6 and all(0 <= key < 1 << phrasebook.KEY_BITS for key in keys)
    assert ngram_key([1, 2]) == ngram_key((1, 2)) == phrasebook.short_key(phrasebook.ngram_hash([1, 2]))


def test_ngrams_whose_stored_keys_collide_are_dropped(monkeypatch):
    """With 7-bit keys some of 40 kept n-grams share a key: those are left out, and every one kept still finds its
    own continuation."""
    monkeypatch.setattr(phrasebook, "KEY_BITS", 7)
    sequences = [[a, b, 100 + a] for a in range(1, 6) for b in range(1, 9)] * 2  # "a b" -> 100 + a, twice each
    book = phrasebook.build(sequences, PhrasebookConfig(min_ngram=2, max_ngram=2, length=1))
    assert 20 < len(book) < 40 and len(set(book.keys)) == len(book)
    kept = [(a, b) for a in range(1, 6) for b in range(1, 9) if phrasebook.ngram_key([a, b]) in book.keys]
    assert len(kept) == len(book) and all(book.lookup([a, b], 1) == ([100 + a], 2) for a, b in kept)


def book_of(sequences, **options) -> Phrasebook:
    return phrasebook.build(sequences, PhrasebookConfig(**options))


def test_a_lookup_takes_the_longest_kept_ngram_and_its_majority_continuation():
    book = book_of([[1, 2, 3, 4, 10, 11], [1, 2, 3, 4, 10, 12], [9, 3, 4, 20, 21], [8, 3, 4, 20, 21],
                    [5, 3, 4, 20, 21]],
                   min_ngram=2, max_ngram=4, length=3, min_support=2)
    assert book.lookup([7, 1, 2, 3, 4], 8) == ([10], 4)  # "1 2 3 4" twice: 10 then 11 | 12, no majority
    assert book.lookup([7, 0, 3, 4], 8) == ([20, 21], 2)  # "3 4": 20 21 in three of its five occurrences
    assert book.lookup([7, 0, 3, 4], 1) == ([20], 2)  # the limit
    assert book.lookup([6, 6, 6], 8) == ([], 0)  # nothing kept
    assert book.lookup([4], 8) == ([], 0)  # shorter than the shortest n-gram


def test_a_phrasebook_round_trips_and_refuses_what_it_cannot_use(tmp_path):
    sequences = [[1, 2, 3, 66000, 5], [1, 2, 3, 66000, 5], [4, 2, 3, 66000, 7]]  # an id that needs 32 bits
    book = book_of(sequences)
    assert len(book) > 0
    folder = phrasebook.save(tmp_path / "book", book, TARGET, {"data": ["test"]})
    loaded = phrasebook.load(folder, TARGET)
    assert loaded.keys == book.keys and torch.equal(loaded.tokens, book.tokens)
    assert loaded.lookup([9, 1, 2, 3], 8) == book.lookup([9, 1, 2, 3], 8) == ([66000, 5], 3)

    small = phrasebook.save(tmp_path / "small", book_of([[1, 2, 3, 4]] * 2), TARGET, {})
    assert phrasebook.load(small, TARGET).lookup([1, 2], 8) == ([3, 4], 2)  # stored in 16 bits

    with pytest.raises(PhrasebookError, match="no phrasebook"):
        phrasebook.load(tmp_path / "missing", TARGET)
    with pytest.raises(PhrasebookError, match="built for target"):
        phrasebook.load(folder, {**TARGET, "name": "other"})
    meta = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**meta, "format": "other/1"}))
    with pytest.raises(PhrasebookError, match="unknown format"):
        phrasebook.load(folder, TARGET)
    small_vocab = {**TARGET, "vocab_size": 1000}  # the index holds id 66000
    (folder / "config.json").write_text(json.dumps({**meta, "target": small_vocab}))
    with pytest.raises(PhrasebookError, match="outside the target's vocabulary"):
        phrasebook.load(folder, small_vocab)
    (folder / "config.json").write_text(json.dumps(meta))
    (folder / "index.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(PhrasebookError, match="corrupt"):
        phrasebook.load(folder, TARGET)


def test_settings_out_of_range_are_refused():
    for bad in ({"min_ngram": 0}, {"min_ngram": 5, "max_ngram": 4}, {"length": 0}, {"length": 256},
                {"min_support": 0}):
        with pytest.raises(ValueError):
            PhrasebookConfig(**bad)


def test_the_registry_loads_the_targets_phrasebook_and_drafts_on_without_a_broken_one(tmp_path, monkeypatch, caplog,
                                                                                       tiny_target):
    from core.drafting.base import NgramDrafter
    from drafter import registry

    folder = tmp_path / "phrasebook"
    monkeypatch.setattr(registry, "default_weights", lambda name, kind: folder)
    monkeypatch.setattr(registry, "_books", {})
    assert registry.target_phrasebook(tiny_target) is None  # none shipped: nothing said, nothing loaded
    phrasebook.save(folder, book_of([[1, 2, 3, 4]] * 2), tiny_target.identity, {})
    monkeypatch.setattr(registry, "_books", {})
    assert registry.with_lookup(NgramDrafter(), tiny_target).phrasebook.lookup([1, 2], 8) == ([3, 4], 2)
    assert registry.with_lookup(NgramDrafter(), tiny_target, use_phrasebook=False).phrasebook is None
    (folder / "index.safetensors").write_bytes(b"garbage")
    monkeypatch.setattr(registry, "_books", {})
    with caplog.at_level("WARNING"):
        assert registry.with_lookup(NgramDrafter(), tiny_target).phrasebook is None
    assert "drafting without the phrasebook" in caplog.text and "corrupt" in caplog.text


def test_each_ngram_carries_its_agreement_class_and_a_lookup_its_grade():
    assert [phrasebook.agreement_class(share, support) for share, support in
            ((0.1, 2), (0.1, 4), (0.1, 16), (0.5, 3), (1.0, 2), (1.0, 100))] == [0, 1, 2, 6, 12, 14]
    assert phrasebook.grade(3, None) == 3 and phrasebook.grade(3, 7) == 3 * phrasebook.CLASSES + 7
    # "1 2" went on with 3 in two of its three occurrences, "2 3" with 4 in both of its
    book = book_of([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 9]], min_ngram=2, max_ngram=2, length=2)
    two_thirds, whole = phrasebook.agreement_class(2 / 3, 3), phrasebook.agreement_class(1.0, 2)
    assert book.graded([1, 2], 8) == ([3, 4], 2, phrasebook.grade(2, two_thirds))
    assert book.lookup([1, 2], 8) == ([3, 4], 2)
    assert book.graded([2, 3], 8) == ([4], 2, phrasebook.grade(2, whole)) and book.graded([7, 7], 8) == ([], 0, 0)
    ungraded = Phrasebook(book.config, book.keys, book.offsets, book.tokens)  # a format /2 book: the match length
    assert ungraded.graded([1, 2], 8) == ([3, 4], 2, 2) and ungraded.prior(2) == ()


def test_a_calibration_measures_each_grades_slots_on_held_out_replies_and_travels_with_the_book(tmp_path):
    # "1 2" -> 3 4 5 (two of its three occurrences: a grade of its own), "2 3" -> 4 5 and "3 4" -> 5 (both of two)
    book = book_of([[1, 2, 3, 4, 5]] * 2 + [[1, 2, 7]], min_ngram=2, max_ngram=2, length=3)
    held = [([0, 1, 2, 3, 4, 6], 1)] * 20 + [([0, 1, 2, 8], 1)] * 20  # after "1 2": 3 4 then 6, or 8 at once
    rates, reached = phrasebook.calibrate(book, held, min_reached=20)
    one_two = book.graded([1, 2], 1)[2]
    assert reached[one_two][:3] == [40, 20, 20] and rates[one_two] == (0.5, 1.0, 0.0)  # slot 3's 5 never kept
    assert phrasebook.calibrate(book, held, min_reached=21)[0][one_two] == (0.5,)  # slots reached too rarely dropped
    calibrated = dataclasses.replace(book, calibration=rates)
    folder = phrasebook.save(tmp_path / "book", calibrated, TARGET, {}, {"held": ["test"]})
    loaded = phrasebook.load(folder, TARGET)
    assert loaded.classes == book.classes and loaded.prior(one_two) == (0.5, 1.0, 0.0)
    assert loaded.graded([1, 2], 8) == book.graded([1, 2], 8)
    meta = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**meta, "format": phrasebook.UNGRADED}))
    old = phrasebook.load(folder, TARGET)  # a format /2 book is still read, by match length alone
    assert old.classes is None and old.graded([1, 2], 8) == ([3, 4, 5], 2, 2)
    (folder / "config.json").write_text(json.dumps({**meta, "calibration": {"rates": {"x": [0.5]}}}))
    with pytest.raises(PhrasebookError, match="invalid calibration"):
        phrasebook.load(folder, TARGET)
    index = load_file(str(folder / "index.safetensors"))
    too_high = torch.full_like(index["classes"], phrasebook.CLASSES)
    save_file({**index, "classes": too_high}, str(folder / "index.safetensors"))
    (folder / "config.json").write_text(json.dumps(meta))
    with pytest.raises(PhrasebookError, match="agreement classes"):
        phrasebook.load(folder, TARGET)
    with pytest.raises(ValueError, match="agreement classes"):
        phrasebook.save(tmp_path / "old", old, TARGET, {})
