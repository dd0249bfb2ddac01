"""Saved conversations: one JSON file each in a local folder (nothing leaves the machine).

A conversation is {"id", "title", "created", "updated", "messages": [{"role", "content"}, ...]}; files are
written atomically (temporary file, then rename), so a crash never leaves half a conversation.
"""
from __future__ import annotations

import builtins
import json
import re
import time
import uuid
from pathlib import Path

TITLE_CHARS = 60


class ConversationError(ValueError):
    """A conversation id that does not exist, or a bad title; the message says which."""


def title_from(messages: list[dict]) -> str:
    """The first user message, shortened: the title until the user renames it."""
    first = next((m["content"] for m in messages if m.get("role") == "user"), "New chat")
    first = " ".join(str(first).split())
    return first if len(first) <= TITLE_CHARS else first[: TITLE_CHARS - 1] + "…"


class ConversationStore:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def _path(self, conv_id: str) -> Path:
        if not re.fullmatch(r"[0-9a-f]{32}", conv_id or ""):
            raise ConversationError(f"no conversation {conv_id!r}")
        return self.folder / f"{conv_id}.json"

    def list(self) -> list[dict]:
        """Every conversation's id, title and last update, newest first (unreadable files are skipped)."""
        rows = []
        for path in self.folder.glob("*.json"):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                rows.append({"id": data["id"], "title": data["title"], "updated": data["updated"]})
            except (OSError, ValueError, KeyError):
                continue
        return sorted(rows, key=lambda r: -r["updated"])

    def load(self, conv_id: str) -> dict:
        path = self._path(conv_id)
        if not path.exists():
            raise ConversationError(f"no conversation {conv_id!r}")
        return json.loads(path.read_text(encoding="utf-8"))

    def save(self, messages: builtins.list[dict], conv_id: str | None = None) -> str:
        """Write the messages (a new conversation when conv_id is None or was deleted meanwhile); returns the id."""
        now = time.time()
        try:
            data = self.load(conv_id) if conv_id else None
        except ConversationError:
            data = None
        data = data or {"id": uuid.uuid4().hex, "title": title_from(messages), "created": now}
        data.update(messages=[{"role": m["role"], "content": m["content"]} for m in messages], updated=now)
        self._write(data)
        return data["id"]

    def rename(self, conv_id: str, title: str) -> None:
        title = " ".join((title or "").split())
        if not title:
            raise ConversationError("a title cannot be empty")
        data = self.load(conv_id)
        data["title"] = title[:200]
        self._write(data)

    def delete(self, conv_id: str) -> None:
        path = self._path(conv_id)
        if not path.exists():
            raise ConversationError(f"no conversation {conv_id!r}")
        path.unlink()

    def _write(self, data: dict) -> None:
        path = self._path(data["id"])
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
        tmp.replace(path)
