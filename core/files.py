"""Small files the exporter keeps across crashes."""
from __future__ import annotations

import os
import threading
from pathlib import Path


def write_atomically(path: Path, text: str) -> None:
    """Write ``path`` so that a crash leaves the old content or the new, never half of it
    (several threads may write the same path at once)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    partial.write_text(text)
    partial.replace(path)
