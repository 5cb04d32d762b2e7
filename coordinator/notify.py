"""Wake long-polls as soon as what they watch changes, whichever coordinator process
changed it (the store tells every process: ``Store.subscribe``)."""
import asyncio
import time

from .store import Store


class CallerGone(Exception):
    """The caller of a long-poll hung up before its answer."""


def refuse_in_transaction(what: str) -> None:
    """Raise if this task is inside a transaction: ``what`` waits, and nothing that waits
    holds the lab (docs/architecture.md, "Nothing that waits holds the lab")."""
    if Store.in_transaction():
        raise RuntimeError(f"{what} inside a transaction would hold every other writer for its whole wait")


class Notifier:
    def __init__(self):
        self._events: dict[str, asyncio.Event] = {}
        self.waiting = 0  # long-polls waiting now

    def watch(self, key: str) -> asyncio.Event:
        """The event set at the next change of ``key``; take it *before* reading the state."""
        return self._events.setdefault(key, asyncio.Event())

    def heard(self, keys: set[str] | None) -> None:
        """``keys`` changed (``None``: anything may have)."""
        for key in list(self._events) if keys is None else keys:
            event = self._events.pop(key, None)
            if event is not None:
                event.set()

    async def long_poll(self, key: str, read, done, wait_s: float, gone):
        """``read()`` again at each change of ``key`` until ``done(value)`` or ``wait_s`` runs
        out; ``CallerGone`` once ``gone()`` (which returns when the caller hangs up) returned.
        Never inside a transaction: it would hold the lab for the whole wait."""
        refuse_in_transaction("a long-poll")
        deadline = time.monotonic() + wait_s
        hung_up = asyncio.ensure_future(gone())
        try:
            while True:
                event = self.watch(key)
                value = await read()
                remaining = deadline - time.monotonic()
                if done(value) or remaining <= 0:
                    return value
                woken = asyncio.ensure_future(event.wait())
                self.waiting += 1
                try:
                    await asyncio.wait({woken, hung_up}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    self.waiting -= 1
                woken.cancel()
                if hung_up.done():
                    raise CallerGone()
        finally:
            hung_up.cancel()


def host_key(name: str) -> str:
    return f"host:{name}"


def lease_key(lease_id: str) -> str:
    return f"lease:{lease_id}"


def ticket_key(ticket_id: str) -> str:
    return f"ticket:{ticket_id}"


def op_key(op_id: str) -> str:
    return f"op:{op_id}"


# Any device's public view may have changed (state, holder, expiry, flash, claims): the
# board's event stream (events.py) reads the devices again.
BOARD_KEY = "board"
