"""The tokens of a lab ``device-loop up --tokens`` starts (docs/architecture.md, "Identity"): an
admin token for the person who started it and one for its exporter, made on the lab's database
before its coordinator starts, kept in its data folder (mode 0600), and used again by the next
start for as long as they are valid."""
from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

ADMIN_FILE = "admin-token"
EXPORTER_FILE = "exporter-token"


def lab_tokens(data_dir: Path, host: str) -> tuple[Path, Path]:
    """(the file of the admin token, the exporter's), each holding a valid token of this lab's
    database: the one it held, or one made now."""
    return asyncio.run(_lab_tokens(data_dir, host))


async def _lab_tokens(data_dir: Path, host: str) -> tuple[Path, Path]:
    from device_loop.coordinator.identity import LAB_OWNER, issue_token, token_identity
    from device_loop.coordinator.rules import Rules
    from device_loop.coordinator.serve import sqlite_url

    from .admin import _on_database  # (as `admin token create --data-dir` opens the lab's database)

    async def made(store) -> tuple[Path, Path]:
        rules = Rules(store)
        for name, whose in ((ADMIN_FILE, {"username": LAB_OWNER, "admin": True}), (EXPORTER_FILE, {"host": host})):
            path = data_dir / name
            try:
                held = path.read_text().strip()
            except OSError:
                held = ""
            if held and await token_identity(rules, held) is not None:
                continue
            token = await issue_token(store, time.time, **whose)
            await rules.admin.record("device-loop up", "token_create",
                                     {k: token[k] for k in ("id", "user", "admin", "host")})
            _write_private(path, f"{token['token']}\n")
        return data_dir / ADMIN_FILE, data_dir / EXPORTER_FILE

    return await _on_database(sqlite_url(data_dir), made)


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, which only this account may read, never readable by others
    on the way (made 0600, then renamed over the old one)."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(text)
    os.replace(partial, path)
