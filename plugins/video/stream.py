"""The stream service of one lease: an HTTP server with ``stream.mjpg``
(``multipart/x-mixed-replace``), ``snapshot.jpg`` and a page showing the stream.

Run as ``python -m device_loop.plugins.video.stream --fd N ...`` on a socket the exporter
bound. One thread captures and JPEG-encodes each frame once, whatever the number of
viewers, and only while someone watches; one event loop sends it to every viewer. A
viewer is sent the newest frame once it took the last one, so a slow viewer skips
frames instead of slowing the others or piling them up in memory. When the source
fails, every stream ends and new requests get 503.

Each connection carries one request (``Connection: close``): the lease's gate checks the
capability of each.
"""
from __future__ import annotations

import argparse
import asyncio
import threading
import time

import cv2

from device_loop.plugin import inherited_listener

from . import FAILED, READY
from .sources import SourceFailed, open_source

BOUNDARY = "devloopframe"
PAGE = (b"<!doctype html><title>camera</title><style>body{margin:0;background:#111}img{max-width:100%}</style>"
        b"<img src='stream.mjpg' alt='camera stream'>")
MAX_REQUEST = 8192
WAIT_S = 10.0  # a viewer waits this long for a frame before the stream ends


class Broadcaster:
    """The newest frame of the source, encoded once for every viewer: as JPEG, and as the
    stream's part (boundary, headers, JPEG), so that sending it to a viewer is one write
    of bytes made once."""

    def __init__(self, loop: asyncio.AbstractEventLoop, source, fps: float, quality: int,
                 failed: str | None = None):
        self.loop, self.source, self.period, self.quality = loop, source, 1.0 / fps, quality
        self.jpeg, self.part, self.seq, self.failed = b"", b"", 0, failed
        self.new_frame = asyncio.Event()  # set at each frame (and when the source fails)
        self.watchers = 0
        self._wanted = threading.Event()  # someone watches: capture
        if not failed:
            threading.Thread(target=self._capture, name="capture", daemon=True).start()

    def _capture(self) -> None:
        due = time.monotonic()
        while True:
            if not self._wanted.is_set():
                self._wanted.wait()
                due = time.monotonic()
            try:
                frame = self.source.read()
            except SourceFailed as exc:
                self.loop.call_soon_threadsafe(self._publish, None, str(exc))
                return
            ok, encoded = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, self.quality])
            jpeg = encoded.tobytes()
            part = b"".join((f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\nContent-Length: {len(jpeg)}\r\n\r\n"
                             .encode(), jpeg, b"\r\n"))
            self.loop.call_soon_threadsafe(self._publish, (jpeg, part), None)
            due += self.period
            time.sleep(max(0.0, due - time.monotonic()))

    def _publish(self, frame: tuple[bytes, bytes] | None, failed: str | None) -> None:
        if frame is not None:
            (self.jpeg, self.part), self.seq = frame, self.seq + 1
        self.failed = self.failed or failed
        self.new_frame.set()
        self.new_frame = asyncio.Event()

    async def frame_after(self, seq: int) -> tuple[int, bytes, bytes] | None:
        """The newest frame after ``seq`` (waiting for it): ``(seq, jpeg, part)``; None once the
        source failed (or gave nothing for ``WAIT_S``)."""
        self.watchers += 1
        self._wanted.set()
        try:
            while self.seq <= seq and not self.failed:
                await asyncio.wait_for(self.new_frame.wait(), WAIT_S)
        except asyncio.TimeoutError:
            return None
        finally:
            self.watchers -= 1
            if not self.watchers:
                self._wanted.clear()
        return None if self.failed else (self.seq, self.jpeg, self.part)


def _head(status: str, kind: str, length: int | None = None) -> bytes:
    lines = [f"HTTP/1.0 {status}", f"Content-Type: {kind}", "Cache-Control: no-store", "Connection: close"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def serve(broadcaster: Broadcaster):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
            method, path = request.split(b" ", 2)[:2]
            path = path.split(b"?", 1)[0]
            if method not in (b"GET", b"HEAD"):
                reply = _head("405 Method Not Allowed", "text/plain", 0)
            elif broadcaster.failed:
                text = f"the camera failed: {broadcaster.failed}\n".encode()
                reply = _head("503 Service Unavailable", "text/plain", len(text)) + text
            elif path == b"/stream.mjpg":
                return await stream(writer)
            elif path == b"/snapshot.jpg":
                frame = await broadcaster.frame_after(broadcaster.seq)
                if frame is None:
                    text = f"no frame: {broadcaster.failed or 'the camera gives none'}\n".encode()
                    reply = _head("503 Service Unavailable", "text/plain", len(text)) + text
                else:
                    reply = _head("200 OK", "image/jpeg", len(frame[1])) + frame[1]
            elif path == b"/":
                reply = _head("200 OK", "text/html", len(PAGE)) + PAGE
            else:
                text = b"stream.mjpg, snapshot.jpg\n"
                reply = _head("404 Not Found", "text/plain", len(text)) + text
            writer.write(reply)
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ValueError,
                ConnectionError):
            pass
        finally:
            writer.close()

    async def stream(writer: asyncio.StreamWriter) -> None:
        writer.write(_head("200 OK", f"multipart/x-mixed-replace; boundary={BOUNDARY}"))
        seq = 0
        while (frame := await broadcaster.frame_after(seq)) is not None:
            seq, _, part = frame
            writer.write(part)
            await writer.drain()  # a slow viewer waits here; the frames it misses are skipped
        writer.write(f"--{BOUNDARY}--\r\n".encode())  # the source failed: the stream ends
        await writer.drain()
        writer.close()

    return handle


async def run(args) -> None:
    loop = asyncio.get_running_loop()
    try:
        source = await asyncio.to_thread(open_source, args.kind, args.source, args.name, args.width, args.height,
                                         args.fail_switch)
        broadcaster = Broadcaster(loop, source, args.fps, args.quality)
        print(READY, flush=True)  # the plugin waits for this line (or FAILED) before the lease is ready
    except SourceFailed as exc:  # say so to whoever asks, rather than refuse connections
        print(f"{FAILED}{exc}", flush=True)
        broadcaster = Broadcaster(loop, None, args.fps, args.quality, failed=str(exc))
    server = await asyncio.start_server(serve(broadcaster), sock=inherited_listener(args.fd), limit=MAX_REQUEST)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fd", type=int, required=True, help="inherited listening socket")
    parser.add_argument("--kind", choices=("sim", "capture"), required=True)
    parser.add_argument("--source", default="", help="device node, file or URL (capture)")
    parser.add_argument("--name", default="", help="what the simulated camera writes on its frames")
    parser.add_argument("--fail-switch", help="simulated camera: fail while this file exists")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--fps", type=float, default=15)
    parser.add_argument("--quality", type=int, default=80)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
