"""Wake long-polls as soon as what they watch changes, whichever coordinator process
changed it (the store tells every process: ``Store.subscribe``)."""
import asyncio
import time


class Notifier:
    def __init__(self):
        self._events: dict[str, asyncio.Event] = {}

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
        """``read()`` again at each change of ``key`` until ``done(value)``, ``wait_s`` runs
        out, or the caller has ``gone()`` away."""
        deadline = time.monotonic() + wait_s
        while True:
            event = self.watch(key)
            value = await read()
            remaining = deadline - time.monotonic()
            if done(value) or remaining <= 0 or await gone():
                return value
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except asyncio.TimeoutError:
                pass


def host_key(name: str) -> str:
    return f"host:{name}"


def lease_key(lease_id: str) -> str:
    return f"lease:{lease_id}"


def op_key(op_id: str) -> str:
    return f"op:{op_id}"
