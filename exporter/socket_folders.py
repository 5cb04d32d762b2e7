"""Where the services behind a lease's gates listen (docs/architecture.md, "The lease gate"):
a folder of unix sockets per lease, inside one folder that only the exporter's account may
enter, so no other local process (another person's job, a guest's user network) reaches a
console, a camera or a screen without the lease's secret.

The root is made in the system's temporary folder (``mkdtemp``: mode 0700, a name nobody can
guess), not in the state folder, whose path may be too long for a unix socket's 107 bytes.
Its path is noted in the state folder, so that the next start removes what a killed exporter
left there.
"""
from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger("device_loop.exporter")
PREFIX = "devloop-sockets-"


class SocketFolders:
    def __init__(self, state_dir: Path):
        self.note = Path(state_dir) / "sockets-folder"
        self._root: Path | None = None

    def _made(self) -> Path:
        if self._root is None:
            self.remove_leftover()
            self._root = Path(tempfile.mkdtemp(prefix=PREFIX))
            self.note.parent.mkdir(parents=True, exist_ok=True)
            self.note.write_text(str(self._root))
        return self._root

    def remove_leftover(self) -> None:
        """Remove the folder an earlier run of this exporter noted (if it is one of ours)."""
        try:
            left = Path(self.note.read_text().strip())
        except OSError:
            return
        if left.name.startswith(PREFIX) and left.parent == Path(tempfile.gettempdir()):
            shutil.rmtree(left, ignore_errors=True)
        self.note.unlink(missing_ok=True)

    def of_lease(self, lease_id: str) -> Path:
        """The folder of ``lease_id``'s sockets (made if it is not there)."""
        if not lease_id or "/" in lease_id or lease_id.startswith("."):
            raise ValueError(f"{lease_id[:80]!r} is not a lease id")
        folder = self._made() / lease_id
        folder.mkdir(mode=0o700, exist_ok=True)
        return folder

    def lease_ended(self, lease_id: str) -> None:
        """Its services are gone: so are their sockets."""
        if self._root is not None:
            shutil.rmtree(self._root / lease_id, ignore_errors=True)

    def close(self) -> None:
        """The exporter is stopping, its services gone: the root goes too."""
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self.note.unlink(missing_ok=True)
            self._root = None
