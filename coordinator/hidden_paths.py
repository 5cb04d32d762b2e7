"""Exporter-side file paths, out of what the public sees (docs/architecture.md, "What
exporters report is data"): an operation's message, a step's fault or a health reason may
quote a path of the exporter's machine (``No such file or directory:
'/root/.local/share/device-loop/...'``), which says whose account runs it and how its disk is
laid out. The holder of the operation's lease, its requester and admins see the text as
reported; anyone else sees ``[path]`` in its place."""
from __future__ import annotations

import re
from typing import Any

HIDDEN = "[path]"
_SEGMENT = r"[\w.@%+=~-]+"
#: An absolute path of two parts or more (``/dev/ttyUSB0``), or a home one (``~/x``,
#: ``~alice/x``); not a URL's (``://``), a ratio or a unit (``1/2``, ``MB/s``), whose slash
#: follows a word, nor a tag's end (``</b>``)
_PATH = re.compile(rf"(?<![\w.~/:\\-])(?:~[\w.-]*(?:/{_SEGMENT})+|/{_SEGMENT}(?:/{_SEGMENT})+)/?")


def hide_paths(text: str) -> str:
    """``text`` with each file path in it replaced by ``[path]``."""
    return _PATH.sub(HIDDEN, text)


def hide_paths_in(value: Any) -> Any:
    """``value`` (JSON: an operation's result) with each path in its strings replaced."""
    if isinstance(value, str):
        return hide_paths(value)
    if isinstance(value, list):
        return [hide_paths_in(item) for item in value]
    if isinstance(value, dict):
        return {key: hide_paths_in(item) for key, item in value.items()}
    return value
