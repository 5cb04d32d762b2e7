"""A keepalive lease kept alive from a thread of its own (docs/architecture.md, "Leases that
live as long as their client"): a keep-alive every third of the lease's keepalive, so two may
be lost to the network before the lease lapses; a keep-alive the coordinator refuses (the
lease ended: released by an admin, revoked, expired, failed) is the lease *lost*, told once to
``on_lost`` and never retried."""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable

from device_loop.core import LIVE_LEASE_STATES

from .http import CoordinatorError

if TYPE_CHECKING:
    from .lab import Lease


#: Keep-alives a keepalive holds: two may be lost to the network before the lease lapses.
KEEPALIVES_A_LAPSE = 3
#: After a keep-alive the network or the coordinator failed, the next try comes this soon (or a
#: period, if less): a coordinator restarting is back within seconds, and counts its keepalives
#: from then (docs/architecture.md, "A lab that was away")
RETRY_S = 1.0


def keepalive_period(keepalive_s: float) -> float:
    """How often a client reads what has a keepalive of ``keepalive_s`` (a lease's keep-alive,
    a ticket's long-poll): a third of it."""
    return keepalive_s / KEEPALIVES_A_LAPSE


class KeepAlive:
    """Keeps ``lease`` (a keepalive lease) alive until ``stop()``; ``on_lost(reason)`` is
    called once, from its thread, when a keep-alive is refused, and ``lost`` says why."""

    def __init__(self, lease: "Lease", on_lost: Callable[[str], object] | None = None):
        keepalive = lease.data.get("keepalive_s")
        if not keepalive:
            raise ValueError(f"{lease.id} is no keepalive lease (reserve it with a keepalive)")
        self.lease = lease
        self.on_lost = on_lost
        self.period = keepalive_period(keepalive)
        self.lost: str | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"keepalive-{lease.id}", daemon=True)

    def start(self) -> "KeepAlive":
        """Begin keeping it alive (the first keep-alive a third of the keepalive from now)."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Keep it alive no longer; returns once the thread has ended (a keep-alive under way
        ends first: within a third of the keepalive or the client's timeout, whichever is less)."""
        self._stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> "KeepAlive":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self) -> None:
        pause = self.period
        while not self._stopping.wait(pause):
            pause = self.period
            try:
                # (each try bounded by the period and the client's own timeout: stop() waits for it)
                lease = self.lease.keep_alive(timeout=min(self.period, self.lease.api.timeout))
            except CoordinatorError as exc:
                if exc.status == 0 or exc.status >= 500:  # the network or the coordinator: the next may pass
                    pause = min(RETRY_S, self.period)
                    continue
                self._lose(f"{self.lease.id} could not be kept alive: {exc.message}")
                return
            if lease.state not in LIVE_LEASE_STATES:  # (a renewal of an ended lease is refused; said all the same)
                self._lose(f"{lease.id} is {lease.state}: {lease.data.get('reason')}")
                return

    def _lose(self, reason: str) -> None:
        if self._stopping.is_set():  # stopped meanwhile: its release, most likely, ended it
            return
        self.lost = reason
        if self.on_lost is not None:
            self.on_lost(reason)
