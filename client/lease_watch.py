"""Watching a lease while a command runs on it (docs/architecture.md, "A lease bound to a
command", "When the lab failed it"): a long-poll on a thread of its own that says when the
lab has failed the command."""
from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any


from .http import CoordinatorError
from .lab import Lease
from .lab_trouble import lost_reason

if TYPE_CHECKING:  # (pydantic is heavy: a with starts its command without loading it)
    from device_loop.core.answers import LeaseAnswer

WATCH_S = 5.0  # the longest the lease goes unseen while the command runs (its end: at once)


class LeaseWatch:
    """Looks at the lease every ``WATCH_S`` (a long-poll that answers at once when it ends),
    on a thread of its own, and says when the lab has failed it: the lease ended, the device
    offline (its exporter gone) or faulty."""

    def __init__(self, lease: Lease, lost: Callable[[str], None]):
        self.lease, self.lost = lease, lost
        self.device = device_reader(lease)
        self.last: LeaseAnswer = lease.data  # (what was last seen of it)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"watch-{lease.id}")
        self._thread.start()

    def _run(self) -> None:
        api, lease_id = self.lease.api, self.lease.id
        while not self._done.is_set():
            try:
                data = api.get(f"/leases/{lease_id}", wait=WATCH_S, unless="active")
            except CoordinatorError as exc:
                if exc.status in (403, 404):
                    self.lost(f"{lease_id} is no longer yours: {exc.message}")
                    return
                self._done.wait(WATCH_S)  # (the coordinator unreachable: the keepalive tells when it matters)
                continue
            self.last = data
            trouble = lost_reason(data, self.device)
            if trouble is not None:
                self.lost(trouble)
                return
            if data["state"] != "active":
                self._done.wait(WATCH_S)  # (pending: the long-poll answers at once)

    def stop(self) -> None:
        """Stop looking (at once: a long-poll under way is left to end on its own thread, or
        with the client's connections)."""
        self._done.set()


def device_reader(lease: Lease) -> Callable[[str], Mapping[str, Any]]:
    """A device's row, to say why it is offline or faulty (unreachable: nothing more is said)."""
    def device(name: str) -> Mapping[str, Any]:
        try:
            return lease.api.get(f"/devices/{name}")
        except CoordinatorError:
            return {}
    return device
