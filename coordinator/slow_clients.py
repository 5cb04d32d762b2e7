"""A deadline for a request's head, which uvicorn does not have.

uvicorn times out only an idle keep-alive connection, and any byte received cancels that
(``timeout_keep_alive``); a head sent a line at a time, or a connection that sends
nothing at all, is kept for ever, and enough of them take every file descriptor.
``head_deadline(s)`` is uvicorn's h11 protocol with one more rule: from the moment a
connection waits for a request (it opened, or it answered the last one) its whole head
must have arrived within ``s`` seconds, else the connection is closed. While a request is
served nothing is timed here: its body's pauses are ``limits.BoundedBodies``'.
"""
from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_TIMEOUT_S = 10.0


class _HeadDeadline(H11Protocol):
    head_timeout_s = HEAD_TIMEOUT_S
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        serving = self.cycle
        super().data_received(data)
        if self.cycle is not serving:  # a head arrived whole: its request is served
            self._disarm()

    def on_response_complete(self) -> None:
        serving = self.cycle
        self._arm()  # before: uvicorn goes on to a request that was pipelined behind it
        super().on_response_complete()
        if self.cycle is not serving:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.head_timeout_s, self._cut)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _cut(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()


def head_deadline(seconds: float) -> type[H11Protocol]:
    """uvicorn's ``http=`` protocol class, closing a connection whose request head takes
    longer than ``seconds`` to arrive."""
    return type("HeadDeadline", (_HeadDeadline,), {"head_timeout_s": seconds})
