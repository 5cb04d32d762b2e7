"""The board's live feed (``GET /api/v1/events``): server-sent events of device changes.

A subscriber gets ``event: snapshot`` (every device, as ``GET /api/v1/devices`` answers),
then ``event: device`` with a device's JSON each time it changed, and a ``: keepalive``
comment when nothing happened for 15 s. Asked with ``html``, each device also carries its
board row, rendered by the web page's template. Where the broadcaster follows the queue,
``event: queue`` (the waiting tickets, as ``GET /api/v1/queue`` answers anyone: no ticket
ids) comes after the snapshot and whenever a ticket came, went or moved, each entry with its
row of the board's queue when asked with ``html``.

One broadcaster per coordinator process, running while anyone watches: it wakes when a
transaction in any process marked ``BOARD_KEY`` (``Store.changed``; a ticket's changes mark
it too) or the key of an operation a device runs as its step between leases (its progress
is the device's ``reason``, and marks only the operation's key), reads the device list (and
the queue) once, and hands what changed, encoded once, to every subscriber. A change costs
one read (of each) and one encoding whatever the number of viewers.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, Sequence

from device_loop.core import EVENTS_KEEPALIVE_S

from .notify import BOARD_KEY, Notifier, op_key
from .store import DatabaseUnavailable

log = logging.getLogger(__name__)

Device = Mapping[str, Any]  # a device as ``GET /api/v1/devices`` shows it
Entry = Mapping[str, Any]   # a waiting ticket as ``GET /api/v1/queue`` shows anyone

KEEPALIVE_S = EVENTS_KEEPALIVE_S
MIN_INTERVAL_S = 0.05  # between two reads: a burst of changes goes out in few reads
RETRY_S = 1.0          # after a failed read
BACKLOG = 64           # reads a subscriber may be behind; past that it is dropped and reconnects
RECONNECT_MS = 2000    # what a browser's EventSource waits before it reconnects


def sse(event: str, data) -> bytes:
    """One server-sent event (JSON never holds a newline: one ``data`` line)."""
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


class _Subscriber:
    def __init__(self, html: bool):
        self.html = html
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue(BACKLOG)
        self.new = True  # gets a snapshot from the next read

    def put(self, frames: Sequence[bytes | None]) -> bool:
        """Queue one read's ``frames`` (None: the end) as one item, so a read that changed a
        thousand devices is one step behind, not a thousand; False (and the stream ends)
        if it is too far behind."""
        try:
            self.queue.put_nowait(None if None in frames else b"".join(f for f in frames if f is not None))
        except asyncio.QueueFull:
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queue.put_nowait(None)
            return False
        return True


class _Encoded:
    """One read's devices (and queue) as frames, each encoded at most once, whoever asks."""

    def __init__(self, devices: Sequence[Device], changed: list[Device], row: Callable[[Device], str] | None,
                 queue: Sequence[Entry] | None = None, queue_changed: bool = False,
                 entry_row: Callable[[Entry], str] | None = None):
        self.devices, self.changed, self.row = devices, changed, row
        self.queue, self.queue_changed, self.entry_row = queue, queue_changed, entry_row
        self._made: dict[tuple[str, bool], list[bytes]] = {}
        self._queue_made: dict[bool, bytes] = {}

    def frames(self, snapshot: bool, html: bool) -> list[bytes]:
        key = ("snapshot" if snapshot else "device", html and self.row is not None)
        if key not in self._made:
            row = self.row if key[1] else None

            def shown(device: Device) -> Device:
                return {**device, "html": row(device)} if row is not None else device
            self._made[key] = ([sse("snapshot", [shown(d) for d in self.devices])] if snapshot
                               else [sse("device", shown(d)) for d in self.changed])
        if self.queue is None or not (snapshot or self.queue_changed):
            return self._made[key]
        return [*self._made[key], self._queue_frame(html)]

    def _queue_frame(self, html: bool) -> bytes:
        html = html and self.entry_row is not None
        if html not in self._queue_made:
            row = self.entry_row if html else None
            assert self.queue is not None
            self._queue_made[html] = sse("queue", [{**e, "html": row(e)} if row is not None else e
                                                   for e in self.queue])
        return self._queue_made[html]


class Broadcaster:
    """Device changes to every subscriber of this process, from one read per change.

    ``read()`` is the device list (as ``GET /api/v1/devices``); ``render_row(device)`` its
    board row, for subscribers that ask for HTML (rendered once per device change).
    ``read_queue()``, if given, is the queue as anyone sees it (``GET /api/v1/queue`` without
    ticket ids), and ``render_entry(entry)`` an entry's row of the board's queue."""

    def __init__(self, read: Callable[[], Awaitable[Sequence[Device]]], notifier: Notifier,
                 render_row: Callable[[Device], str] | None = None,
                 read_queue: Callable[[], Awaitable[Sequence[Entry]]] | None = None,
                 render_entry: Callable[[Entry], str] | None = None):
        self._read, self._notifier, self._render_row = read, notifier, render_row
        self._read_queue, self._render_entry = read_queue, render_entry
        self._subscribers: set[_Subscriber] = set()
        self._poke = asyncio.Event()  # someone came or went
        self._task: asyncio.Task | None = None
        self._rows: dict[str, tuple[str, str]] = {}  # device -> (its JSON, its row) as last rendered

    async def stream(self, html: bool = False) -> AsyncIterator[bytes]:
        """The event stream of one subscriber, until it hangs up (or falls too far behind)."""
        subscriber = _Subscriber(html)
        self._subscribers.add(subscriber)
        self._poke.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        try:
            yield f"retry: {RECONNECT_MS}\n\n".encode()
            while True:
                try:
                    frame = await asyncio.wait_for(subscriber.queue.get(), KEEPALIVE_S)
                except asyncio.TimeoutError:
                    yield b": keepalive\n\n"
                    continue
                if frame is None:
                    return
                yield frame
        finally:
            self._subscribers.discard(subscriber)
            self._poke.set()

    def follow_queue(self, read_queue: Callable[[], Awaitable[Sequence[Entry]]],
                     render_entry: Callable[[Entry], str] | None = None) -> None:
        """Send the queue too, from now on (every subscriber gets it at the next read), unless
        the broadcaster follows it already."""
        if self._read_queue is None:
            self._read_queue, self._render_entry = read_queue, render_entry
            self._poke.set()

    async def close(self) -> None:
        """End every stream (the coordinator stops)."""
        for subscriber in list(self._subscribers):
            subscriber.put([None])
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        sent: dict[str, str] = {}  # device -> its JSON as last sent
        queue_sent: str | None = None  # the queue's JSON as last sent (without the times waited)
        steps: set[str] = set()  # the keys of the operations devices run as steps, as last read
        while self._subscribers:
            # taken before the read: no change slips between (a step begun since is watched after it)
            changes = {self._notifier.watch(key) for key in (BOARD_KEY, *steps)}
            self._poke.clear()
            try:
                devices = await self._read()
                queue = await self._read_queue() if self._read_queue is not None else None
            except DatabaseUnavailable:  # (the store logged the outage, once)
                await asyncio.sleep(RETRY_S)
                continue
            except Exception:
                log.exception("the board's event stream could not read the devices; retrying")
                await asyncio.sleep(RETRY_S)
                continue
            try:
                sent, queue_sent = self._send(devices, sent, queue, queue_sent)
            except Exception:  # a bug in encoding: end the streams (browsers reconnect) rather than freeze them
                log.exception("the board's event stream failed; ending its streams")
                for subscriber in list(self._subscribers):
                    subscriber.put([None])
                self._subscribers.clear()
                return
            steps = {op_key(d["step"]["op"]) for d in devices if d.get("step") and d["step"].get("op")}
            changes |= {self._notifier.watch(key) for key in steps}
            await asyncio.sleep(MIN_INTERVAL_S)  # a change meanwhile is not missed: its event is set
            woken = [*(asyncio.ensure_future(c.wait()) for c in changes), asyncio.ensure_future(self._poke.wait())]
            try:
                await asyncio.wait(woken, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in woken:
                    waiter.cancel()

    def _send(self, devices: Sequence[Device], sent: dict[str, str], queue: Sequence[Entry] | None,
              queue_sent: str | None) -> tuple[dict[str, str], str | None]:
        """What changed since ``sent`` (and ``queue_sent``) to every subscriber (a newcomer:
        everything); what was sent."""
        texts = {d["name"]: json.dumps(d, sort_keys=True) for d in devices}
        self._rows = {name: row for name, row in self._rows.items() if name in texts}
        # the time a ticket waited grows at every read, and its estimate moves with the clock: a
        # change is a ticket that came, went or moved (which sends the estimates afresh too)
        queue_text = None if queue is None else json.dumps(
            [{k: v for k, v in e.items() if k not in ("waiting_s", "estimate")} for e in queue], sort_keys=True)
        encoded = _Encoded(devices, [d for d in devices if sent.get(d["name"]) != texts[d["name"]]],
                           self._row_of(texts, self._render_row) if self._render_row else None,
                           queue, queue_text != queue_sent, self._render_entry)
        for subscriber in list(self._subscribers):
            frames = encoded.frames(subscriber.new, subscriber.html)
            subscriber.new = False
            if frames and not subscriber.put(frames):
                self._subscribers.discard(subscriber)
        return texts, queue_text

    def _row_of(self, texts: dict[str, str], render: Callable[[Device], str]) -> Callable[[Device], str]:
        """A device's row, rendered again only when its JSON changed."""
        def row(device: Device) -> str:
            text = texts[device["name"]]
            cached = self._rows.get(device["name"])
            if cached is None or cached[0] != text:
                cached = self._rows[device["name"]] = (text, str(render(device)))
            return cached[1]
        return row
