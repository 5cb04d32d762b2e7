"""Where a client or an exporter finds its API token."""
from __future__ import annotations

import os
from pathlib import Path

TOKEN_ENV = "DEVICE_LOOP_TOKEN"


class TokenFileError(Exception):
    """The token file may not be used (others can read it)."""


def default_token_file() -> Path:
    base = Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config"))
    return base / "device-loop" / "token"


def load_token(path: str | os.PathLike | None = None) -> str | None:
    """``$DEVICE_LOOP_TOKEN``, else the token file (default ``~/.config/device-loop/token``).

    A token file that group or others may read is refused, like ssh refuses such keys.
    """
    if os.environ.get(TOKEN_ENV, "").strip():
        return os.environ[TOKEN_ENV].strip()
    file = Path(path) if path else default_token_file()
    try:
        mode = file.stat().st_mode
    except FileNotFoundError:
        return None
    if mode & 0o077:
        raise TokenFileError(f"{file} can be read by others; fix it with: chmod 600 {file}")
    return file.read_text().strip() or None


def token_source(path: str | os.PathLike | None = None) -> str:
    """Where ``load_token`` finds the token, in words a refusal of it can say."""
    if os.environ.get(TOKEN_ENV, "").strip():
        return f"${TOKEN_ENV}"
    return str(Path(path) if path else default_token_file())
