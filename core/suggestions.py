"""What a mistyped name most likely meant, for a refusal to say (``sim-bord-0``: did you mean
``sim-board-0``?)."""
from __future__ import annotations

import difflib
from typing import Iterable

#: How many known names a refusal reads to find the likely one: bounded, whatever the lab's size.
MAX_COMPARED = 2000


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` (or ``'x' or 'y'``) for a name close to ``name`` among
    ``known``, else ``""``."""
    close = difflib.get_close_matches(name, list(known)[:MAX_COMPARED], n=2, cutoff=0.75)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
