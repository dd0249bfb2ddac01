import json

import pytest

from app.conversations import ConversationError, ConversationStore


def test_save_list_rename_delete_and_bad_ids(tmp_path):
    store = ConversationStore(tmp_path)
    first = store.save([{"role": "user", "content": "Hello there " * 10}, {"role": "assistant", "content": "Hi"}])
    second = store.save([{"role": "user", "content": "Second"}])
    assert [row["id"] for row in store.list()] == [second, first]  # newest first
    assert store.load(first)["title"].endswith("…") and len(store.load(first)["title"]) <= 60
    store.save([{"role": "user", "content": "Second"}, {"role": "assistant", "content": "ok"}], second)
    assert len(store.load(second)["messages"]) == 2
    store.rename(second, "  my   chat ")
    assert store.load(second)["title"] == "my chat"
    with pytest.raises(ConversationError):
        store.rename(second, "   ")
    store.delete(second)
    assert store.save([{"role": "user", "content": "again"}], second) != second  # deleted meanwhile: a new one
    for bad in ("../../etc/passwd", "x", ""):
        with pytest.raises(ConversationError):
            store.load(bad)
    (tmp_path / "broken.json").write_text("{not json")  # unreadable files are skipped, not fatal
    assert len(store.list()) == 2 and json.loads((tmp_path / f"{first}.json").read_text())["id"] == first
