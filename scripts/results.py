"""Reading a results file back: docs/results keeps its large per-position runs gzipped (NAME.json.gz) within the
repository's budget; every reader takes either form."""
from __future__ import annotations

import gzip
import json
from pathlib import Path


def read_json(path: Path) -> dict:
    """A results file, plain (.json) or gzipped (.json.gz)."""
    path = Path(path)
    return json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())
