"""Wake long-polls in this process as soon as what they watch changes.

Other coordinator processes are not told: every wait is also capped (``RECHECK_S``), so
a long-poll notices a change made elsewhere within that time.
"""
import asyncio

RECHECK_S = 1.0


class Notifier:
    def __init__(self):
        self._events: dict[str, asyncio.Event] = {}

    def watch(self, key: str) -> asyncio.Event:
        """The event set at the next change of ``key``; take it *before* reading the state."""
        return self._events.setdefault(key, asyncio.Event())

    def changed(self, *keys: str) -> None:
        for key in keys:
            event = self._events.pop(key, None)
            if event is not None:
                event.set()

    @staticmethod
    async def wait(event: asyncio.Event, timeout: float) -> None:
        try:
            await asyncio.wait_for(event.wait(), min(timeout, RECHECK_S))
        except asyncio.TimeoutError:
            pass


def host_key(name: str) -> str:
    return f"host:{name}"


def lease_key(lease_id: str) -> str:
    return f"lease:{lease_id}"
